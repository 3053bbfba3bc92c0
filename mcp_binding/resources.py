"""The binding's resources: `pamspec://manifest` and the scope, object, version and events templates.

Each is read through the SDK as the caller, so it is authorized exactly as the read, query, history or events
request behind it; an object the caller may not see answers as a missing one does. URIs follow the templates
with each id percent-encoded (RFC 6570: `workspace:demo` may arrive as `workspace%3Ademo`; both are read).
"""

from __future__ import annotations

import importlib.metadata
import json
from dataclasses import dataclass
from typing import Any, cast
from urllib.parse import parse_qs, quote, unquote, urlsplit

import mcp_types as types

from mcp_binding.callers import Caller
from pamledger_client.errors import PamspecError
from schemas.profiles import ARCHITECTURE_PROFILE, CLAIMED_PROFILES, SPEC_VERSION

MANIFEST_URI = "pamspec://manifest"
JSON = "application/json"
TEMPLATES: tuple[tuple[str, str, str], ...] = (
    ("pamspec://scope/{scope_id}", "scope", "The scope's trusted memory: its first page of current objects "
     "(active, available, retained, corroborated), newest first."),
    ("pamspec://scope/{scope_id}/object/{object_id}", "object", "The current version of an object (its envelope)."),
    ("pamspec://scope/{scope_id}/object/{object_id}/version/{version_id}", "version",
     "One version of an object (its envelope)."),
    ("pamspec://scope/{scope_id}/snapshot/{snapshot_id}", "snapshot", "A sealed evaluation snapshot: its "
     "descriptor and the first page of the trusted memory it pinned (the same bytes whatever is written later)."),
    ("pamspec://scope/{scope_id}/events", "events", "The scope's ledger events in order, 100 at a time; "
     "?after_sequence=N goes on after N (`last_sequence` of a page). Subscribe to it for a doorbell."),
)


@dataclass(frozen=True)
class Target:
    """What a resource URI names."""

    kind: str  # manifest | scope | object | version | events | snapshot
    scope_id: str = ""
    object_id: str = ""
    version_id: str = ""
    snapshot_id: str = ""
    after_sequence: int = 0


def not_found(uri: str) -> PamspecError:
    return PamspecError.of("invalid_request", f"no pamledger resource has this URI: {uri[:200]}",
                           {"uri": uri[:200], "templates": [t[0] for t in TEMPLATES] + [MANIFEST_URI]})


def parse(uri: str) -> Target:
    """The target of a resource URI, or invalid_request naming the templates."""
    if uri == MANIFEST_URI:
        return Target("manifest")
    parts = urlsplit(uri)
    segments = [unquote(s) for s in (parts.netloc + parts.path).split("/")]
    if parts.scheme != "pamspec" or len(segments) < 2 or segments[0] != "scope" or not all(segments[1:]):
        raise not_found(uri)
    scope_id, rest = segments[1], segments[2:]
    if not rest:
        return Target("scope", scope_id)
    if rest == ["events"]:
        return Target("events", scope_id, after_sequence=_after(parts.query, uri))
    if len(rest) == 2 and rest[0] == "object":
        return Target("object", scope_id, rest[1])
    if len(rest) == 2 and rest[0] == "snapshot":
        return Target("snapshot", scope_id, snapshot_id=rest[1])
    if len(rest) == 4 and rest[0] == "object" and rest[2] == "version":
        return Target("version", scope_id, rest[1], rest[3])
    raise not_found(uri)


def _after(query: str, uri: str) -> int:
    values = parse_qs(query).get("after_sequence", ["0"])
    try:
        after = int(values[-1])
    except ValueError:
        after = -1
    if after < 0:
        raise PamspecError.of("invalid_request", "after_sequence must be an integer >= 0",
                              {"field": "after_sequence", "uri": uri[:200]})
    return after


def events_uri(scope_id: str) -> str:
    return f"pamspec://scope/{quote(scope_id, safe=':')}/events"


async def read(caller: Caller, uri: str, transport: str, tools: list[str]) -> types.ReadResourceResult:
    target = parse(uri)
    value = await _value(caller, target, transport, tools)
    return types.ReadResourceResult(contents=[types.TextResourceContents(
        uri=uri, mime_type=JSON, text=json.dumps(value, sort_keys=True, separators=(",", ":")))])


async def _value(caller: Caller, target: Target, transport: str, tools: list[str]) -> dict[str, Any]:
    if target.kind == "manifest":
        return await manifest(caller, transport, tools)
    client = await caller.client()
    if target.kind == "scope":
        return cast(dict[str, Any], await client.query(target.scope_id, limit=50))
    if target.kind == "events":
        return await client.events(target.scope_id, target.after_sequence)
    if target.kind == "snapshot":
        sealed = await client.snapshot_show(target.scope_id, target.snapshot_id)
        return {**sealed, **await client.query(target.scope_id, limit=50, snapshot_id=target.snapshot_id)}
    return cast(dict[str, Any], await client.read(target.scope_id, target.object_id, target.version_id or None))


async def manifest(caller: Caller, transport: str, tools: list[str]) -> dict[str, Any]:
    """Versions, claimed profiles, and who the caller is and may do (from its own grants, query.whoami)."""
    identity = await caller.identity(max_age=1.0)
    grants = identity.grants
    return {
        "pamspec": {"version": SPEC_VERSION, "architecture_profile": ARCHITECTURE_PROFILE,
                    "binding": "mcp", "profiles": list(CLAIMED_PROFILES)},
        "implementation": {"name": "pamledger", "version": _version()},
        "transport": transport,
        "tools": tools,
        "caller": {**identity.actor, "authenticated": identity.authenticated},
        "auth": "off" if grants is None else "enforced",
        "grants": grants if grants is not None else [{"scopes": ["*"], "operations": ["*"]}],
        "scopes": sorted({s for g in grants for s in g["scopes"]}) if grants is not None else ["*"],
        "operations": sorted({o for g in grants for o in g["operations"]}) if grants is not None else ["*"],
        "resources": [MANIFEST_URI] + [t[0] for t in TEMPLATES],
    }


def _version() -> str:
    try:
        return importlib.metadata.version("pamledger")
    except importlib.metadata.PackageNotFoundError:
        return "0+unknown"


def listed() -> list[types.Resource]:
    return [types.Resource(uri=MANIFEST_URI, name="manifest", mime_type=JSON,
                           description="PAMSPEC version, the profiles pamledger claims, and who you are: your "
                                       "actor, the scopes and operations your grants allow.")]


def templates() -> list[types.ResourceTemplate]:
    return [types.ResourceTemplate(uri_template=uri, name=name, description=text, mime_type=JSON)
            for uri, name, text in TEMPLATES]
