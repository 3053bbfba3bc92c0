"""Tool arguments → the NATS binding's request bodies: defaults for who acts, provenance and idempotency, and the
names PAMSPEC's binding uses where ours differ. Pure: no I/O, no clock, no randomness.

Why derived keys: an MCP host retries a call whose answer it lost, and a model repeats a call it already made.
A write without an `idempotency_key` gets one derived from (actor, tool, arguments as given), so the same call
writes once and answers the first result again; the result names the key used.
"""

from __future__ import annotations

import hashlib
from typing import Any

import msgspec

from pamledger_client.errors import PamspecError
from schemas.canonical import canonical_bytes

Actor = dict[str, str]

# The writes: tool -> the writer command it sends.
WRITES: dict[str, str] = {
    "pamspec.create": "create", "pamspec.update": "update", "pamspec.transition": "transition",
    "pamspec.delete": "delete", "pamspec.relate": "relate", "pamspec.redact": "redact",
    "pamspec.promote": "promote", "pamledger.grant_delegation": "grant_delegation",
    "pamledger.check_delegation": "check_delegation", "pamledger.revoke_delegation": "revoke_delegation",
    "pamledger.snapshot_create": "snapshot_create", "pamledger.eval_start": "eval_start",
    "pamledger.eval_end": "eval_end",
}
_WITH_PROVENANCE = frozenset({"create", "update", "transition", "delete", "relate", "redact", "promote"})

# pamspec.query `filters`: PAMSPEC's names (query.schema.json) -> ours (docs/protocol.md "query").
FILTER_NAMES: dict[str, str] = {
    "object_type": "object_types", "lifecycle_state": "lifecycle_states", "availability_state": "availability_states",
    "retention_state": "retention_states", "validation_state": "validation_states", "provenance_id": "provenance_ids",
}
_LISTS = frozenset(FILTER_NAMES.values()) | {"schema_ids", "actor_ids"}
NATIVE_FILTERS = _LISTS | {"time", "ledger_sequence", "quality"}
QUERY_ONLY = frozenset({"text", "order", "as_of_sequence", "min_sequence"})  # Query's, not Search's
SEMANTIC_KEYS = frozenset({"text", "vector", "mode"})


def invalid(message: str, **details: Any) -> PamspecError:
    return PamspecError.of("invalid_request", message, details)


def derived_key(actor_id: str, tool: str, arguments: dict[str, Any]) -> str:
    """`mcp:<digest>` of who calls which tool with which arguments: the same call, the same key."""
    try:
        text = canonical_bytes({"actor_id": actor_id, "tool": tool, "arguments": arguments})
    except (TypeError, ValueError, OverflowError, msgspec.EncodeError) as exc:
        raise invalid(f"arguments of {tool} cannot be encoded: {exc}", tool=tool) from None
    return "mcp:" + hashlib.sha256(text).hexdigest()[:40]


def default_provenance(tool: str, actor: Actor, key: str) -> dict[str, Any]:
    """Provenance naming the tool call (provenance.schema.json; the writer adds recorded_at). Derived from the
    idempotency key, so a retried call sends the same request and replays instead of conflicting."""
    return {"provenance_id": f"prov:{key}", "actor": actor, "activity": f"mcp.tool_call:{tool}"}


def write_body(tool: str, arguments: dict[str, Any], actor: Actor) -> tuple[str, dict[str, Any], str]:
    """(command, body, idempotency key) for a write tool; arguments the caller gave are kept verbatim."""
    command = WRITES[tool]
    key = arguments.get("idempotency_key") or derived_key(actor["actor_id"], tool, arguments)
    body = {**arguments, "idempotency_key": key}
    body.setdefault("actor", actor)
    if command in _WITH_PROVENANCE:
        body.setdefault("provenance", default_provenance(tool, body["actor"], key))
    if command == "relate":
        body.setdefault("directionality", "directed")
    if command == "grant_delegation":
        body.setdefault("granting_actor", actor)
    if command == "check_delegation":
        body.setdefault("delegated_actor_id", actor["actor_id"])
    return command, body, key


def mapped_filters(filters: Any, allowed_extra: frozenset[str] = frozenset()) -> dict[str, Any]:
    """pamspec.query `filters` in our names. A single string where a list is meant is taken as a list of one;
    `relationship_type` is not a filter here (pamledger.related walks relationships)."""
    if filters is None:
        return {}
    if not isinstance(filters, dict):
        raise invalid("filters must be an object", field="filters")
    out: dict[str, Any] = {}
    for name, value in filters.items():
        ours = FILTER_NAMES.get(name, name)
        if name == "relationship_type":
            raise invalid("filters/relationship_type is not supported by pamspec.query: use pamledger.related",
                          field="filters/relationship_type")
        if ours not in NATIVE_FILTERS | allowed_extra:
            raise invalid(f"unknown filter {name!r}", field=f"filters/{name}",
                          known=sorted(set(FILTER_NAMES) | NATIVE_FILTERS | allowed_extra))
        if ours in out:
            raise invalid(f"filter {ours!r} given twice (as {name!r})", field=f"filters/{name}")
        out[ours] = [value] if ours in _LISTS and isinstance(value, str) else value
    return out


def query_call(arguments: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    """pamspec.query → ("query", Query's body) or, with `semantic`, ("search", Search's body)."""
    semantic = arguments.get("semantic")
    if semantic is None:
        if "embedding_space_id" in arguments:
            raise invalid("embedding_space_id names the space of a semantic query: give `semantic` too",
                          field="embedding_space_id")
        body = {"scope_id": arguments["scope_id"], **mapped_filters(arguments.get("filters"), QUERY_ONLY)}
        return "query", {**body, **_present(arguments, "cursor", "limit", "operation_id", "snapshot_id")}
    unknown = sorted(set(semantic) - SEMANTIC_KEYS)
    if unknown:
        raise invalid(f"unknown key {unknown[0]!r} in semantic (text, vector, mode)", field=f"semantic/{unknown[0]}")
    if "cursor" in arguments:
        raise invalid("a semantic query returns one ranked page: no cursor", field="cursor")
    body = {"scope_id": arguments["scope_id"], "mode": semantic.get("mode", "semantic"),
            **mapped_filters(arguments.get("filters")), **_present(semantic, "text", "vector")}
    return "search", {**body, **_present(arguments, "embedding_space_id", "limit", "operation_id", "snapshot_id")}


def _present(arguments: dict[str, Any], *names: str) -> dict[str, Any]:
    return {name: arguments[name] for name in names if arguments.get(name) is not None}


def search_body(arguments: dict[str, Any]) -> dict[str, Any]:
    """pamledger.search → Search's body (`filters` in either naming)."""
    body = {name: value for name, value in arguments.items() if name != "filters"}
    return {**body, **mapped_filters(arguments.get("filters"))}


def related_body(arguments: dict[str, Any]) -> dict[str, Any]:
    """pamledger.related → query.related's body (the start object is its `from_object_id`)."""
    body = {name: value for name, value in arguments.items() if name != "object_id"}
    return {**body, "from_object_id": arguments["object_id"]}


def history_call(arguments: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    """pamspec.inspect_history → ("history", one object's body) or, without `object_id`, ("events", one page of
    the scope's events after `after_sequence`, of `event_classes`)."""
    if "object_id" in arguments:
        return "history", _present(arguments, "scope_id", "object_id", "operation_id")
    body = _present(arguments, "scope_id", "after_sequence", "operation_id")
    return "events", {**body, **({"event_classes": arguments["event_classes"]} if arguments.get("event_classes") else {})}


def history_events(result: dict[str, Any], after: int | None, classes: list[str] | None) -> dict[str, Any]:
    """An object's history with its events narrowed to `after` and `event_classes` (the versions stay whole)."""
    events = [e for e in result.get("events", []) if (after is None or e["ledger_sequence"] > after)
              and (not classes or e.get("event", {}).get("event_type") in classes)]
    return {**result, "events": events}


def subscription_open(arguments: dict[str, Any], actor: Actor, operation_id: str) -> dict[str, Any]:
    """pamspec.subscribe → the gateway's `open` of a poll-mode subscription (`start_sequence` is our
    `after_sequence`); MCP delivers by poll (pamledger.poll, the events resource), never by push.
    `operation_id` (the caller's, else a fresh one): a subscribe repeated after an unsubscribe opens anew."""
    delivery = dict(arguments.get("delivery") or {})
    if delivery.get("mode", "poll") != "poll":
        raise invalid("over MCP a subscription is polled: delivery.mode must be poll (or left out)",
                      field="delivery/mode")
    body: dict[str, Any] = {"scope_id": arguments["scope_id"], "actor": arguments.get("actor") or actor,
                            "filter": arguments.get("filter") or {}, "delivery": {**delivery, "mode": "poll"}}
    if "start_sequence" in arguments:
        body["after_sequence"] = arguments["start_sequence"]
    body["operation_id"] = arguments.get("operation_id") or operation_id
    return body
