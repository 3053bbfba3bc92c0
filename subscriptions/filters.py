"""Per-event checks of a subscription: its filter, and the authorization seam.

Both run for every event, so a filter or an authorization that changes mid-stream takes effect from the
next event on (PAMSPEC 10.8).
"""

from __future__ import annotations

from typing import Any, Protocol

from schemas.subscriptions import Filter

MISSING = object()


def matches(flt: Filter, event: dict[str, Any]) -> bool:
    """True when the event passes every part of the filter."""
    if flt.event_classes is not None and event.get("event_type") not in flt.event_classes:
        return False
    if flt.object_id is not None and event.get("object_id") != flt.object_id:
        return False
    envelope = (event.get("payload") or {}).get("envelope") or {}
    if flt.object_type is not None and envelope.get("object_type") != flt.object_type:
        return False
    for path, expected in (flt.predicate or {}).items():
        if lookup(event, path) != expected:
            return False
    return True


def lookup(event: dict[str, Any], path: str) -> Any:
    """A dotted path into the event; `envelope.x` is short for `payload.envelope.x`."""
    node: Any = event
    parts = path.split(".")
    if parts[0] == "envelope":
        parts = ["payload", *parts]
    for part in parts:
        if not isinstance(node, dict) or part not in node:
            return MISSING
        node = node[part]
    return node


class Authorizer(Protocol):
    """The seam authorization fills: asked once per event before it is delivered. Per-event, beside the
    per-request policy port (infra.request_shell.Policy) that decides whether a subscription may be opened."""

    def allows(self, actor: dict[str, Any], scope_id: str, event: dict[str, Any]) -> bool: ...

    def credential_live(self, credential_id: str) -> bool:
        """Whether the token a subscription is delivered under still works (not revoked, not expired)."""
        ...


class SameScope:
    """Auth off: every actor may read every event of the subscription's own scope."""

    def allows(self, actor: dict[str, Any], scope_id: str, event: dict[str, Any]) -> bool:
        return event.get("scope_id") == scope_id

    def credential_live(self, credential_id: str) -> bool:
        return True
