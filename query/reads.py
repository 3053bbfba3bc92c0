"""Read and Inspect History from authoritative committed state (versions, content store, ledger).

Scope rules: an unknown scope is scope_not_found; an object that is absent here or lives in another
scope is object_not_found, worded the same either way so existence elsewhere never leaks.
"""

from __future__ import annotations

from typing import Any

import msgspec
import psycopg

from infra.ledger import HIDING_STATES
from infra.scopes import scope_exists
from schemas.canonical import canonical_bytes, decode_json
from schemas.errors import ObjectDeleted, ObjectNotFound, ObjectRedacted, ScopeNotFound
from schemas.replies import envelope_bytes

_VERSIONS = (
    "SELECT v.version_id, v.sequence, v.meta, c.content, v.ledger_sequence"
    " FROM memory_versions v LEFT JOIN content_store c ON c.content_digest = v.content_digest"
    " WHERE v.scope_id = %s AND v.object_id = %s"
)


async def read_envelope(
    conn: psycopg.AsyncConnection[Any], scope_id: str, object_id: str, version_id: str | None,
    at: int | None = None,
) -> bytes:
    """The canonical envelope of the current (or named) version, or the error Read answers. `at`: as the
    object stood at that ledger sequence (a snapshot's watermark), content hidden or erased since still
    absent."""
    await _require_scope(conn, scope_id)
    bound, params = (" AND v.ledger_sequence <= %s", (scope_id, object_id, at)) if at is not None \
        else ("", (scope_id, object_id))
    cur = await conn.execute(_VERSIONS + bound + " ORDER BY v.sequence DESC LIMIT 1", params)
    latest = await cur.fetchone()
    if latest is None:
        raise ObjectNotFound("object not found in this scope", details={"object_id": object_id})
    hidden_since = at is not None and await _hidden_now(conn, scope_id, object_id, latest[0])
    row = latest
    if version_id is not None and version_id != latest[0]:
        cur = await conn.execute(_VERSIONS + bound + " AND v.version_id = %s", (*params, version_id))
        row = await cur.fetchone()
        if row is None:
            raise ObjectNotFound("version not found for this object", details={"object_id": object_id,
                                                                                "version_id": version_id})
    latest_meta = decode_json(bytes(latest[2]))
    if latest_meta["availability_state"] == "deleted" and row[0] != latest[0]:
        raise ObjectDeleted("object has been deleted", details={"object_id": object_id,
                                                                 "tombstone_version_id": latest[0]})
    if latest_meta["availability_state"] == "redacted" and row[0] != latest[0]:
        raise ObjectRedacted("object content is redacted", details={"object_id": object_id, "version_id": row[0]})
    meta = latest_meta if row is latest else decode_json(bytes(row[2]))
    if row is not latest and latest_meta["availability_state"] in HIDING_STATES:
        return envelope_bytes(meta, None)  # content a later redaction suppressed (or erased) is not shown
    if meta["availability_state"] == "deleted" and version_id is None:
        raise ObjectDeleted("object has been deleted", details={"object_id": object_id,
                                                                 "tombstone_version_id": latest[0]})
    if meta["availability_state"] == "redacted":
        raise ObjectRedacted("object content is redacted", details={"object_id": object_id, "version_id": row[0]})
    return envelope_bytes(meta, bytes(row[3]) if row[3] is not None and not hidden_since else None)


async def history(conn: psycopg.AsyncConnection[Any], scope_id: str, object_id: str, at: int | None = None,
                  extra: dict[str, Any] | None = None) -> bytes:
    """Versions oldest first (content null where erased) and the object's ledger events in ledger order; `at`:
    only those at or before that ledger sequence (a snapshot's watermark), `extra`: more result fields."""
    await _require_scope(conn, scope_id)
    cur = await conn.execute(_VERSIONS + " ORDER BY v.sequence", (scope_id, object_id))
    every = await cur.fetchall()
    versions = [v for v in every if at is None or v[4] <= at]
    if not versions:
        raise ObjectNotFound("object not found in this scope", details={"object_id": object_id})
    cur = await conn.execute(
        "SELECT ledger_sequence, event FROM ledger WHERE scope_id = %s AND object_id = %s"
        " AND ledger_sequence <= %s ORDER BY ledger_sequence",
        (scope_id, object_id, at if at is not None else 2**63 - 1),
    )
    events = [{"ledger_sequence": seq, "event": msgspec.Raw(bytes(ev))} for seq, ev in await cur.fetchall()]
    hidden = decode_json(bytes(every[-1][2]))["availability_state"] in HIDING_STATES  # all but the latest's
    envelopes = [
        msgspec.Raw(envelope_bytes(decode_json(bytes(v[2])), bytes(v[3]) if v[3] is not None and not (
            hidden and v[0] != every[-1][0]) else None))
        for v in versions
    ]
    return canonical_bytes({"result": {"object_id": object_id, "scope_id": scope_id,
                                       "versions": envelopes, "events": events, **(extra or {})}})


async def _hidden_now(conn: psycopg.AsyncConnection[Any], scope_id: str, object_id: str, version_id: str) -> bool:
    """Whether the object's newest version (now) is another one whose availability hides earlier content."""
    cur = await conn.execute(_VERSIONS + " ORDER BY v.sequence DESC LIMIT 1", (scope_id, object_id))
    newest = await cur.fetchone()
    return newest is not None and newest[0] != version_id and \
        decode_json(bytes(newest[2]))["availability_state"] in HIDING_STATES


async def scope_events(conn: psycopg.AsyncConnection[Any], scope_id: str, partition: int, after: int, limit: int,
                       classes: list[str] | None) -> bytes:
    """The scope's ledger events after `after`, in ledger order, at most `limit` (of `classes` when given).
    `last_sequence` is where the next page starts; events never carry content (docs/protocol.md, stream)."""
    await _require_scope(conn, scope_id)
    cur = await conn.execute(
        "SELECT ledger_sequence, event FROM ledger WHERE scope_id = %s AND partition = %s AND ledger_sequence > %s"
        " AND (%s::text[] IS NULL OR event_type = ANY(%s::text[])) ORDER BY ledger_sequence LIMIT %s",
        (scope_id, partition, after, classes, classes, limit))
    rows = await cur.fetchall()
    events = [{"ledger_sequence": seq, "event": msgspec.Raw(bytes(ev))} for seq, ev in rows]
    return canonical_bytes({"result": {"scope_id": scope_id, "events": events,
                                       "last_sequence": rows[-1][0] if rows else after,
                                       "more": len(rows) == limit}})


async def _require_scope(conn: psycopg.AsyncConnection[Any], scope_id: str) -> None:
    if not await scope_exists(conn, scope_id):
        raise ScopeNotFound("scope not found", details={"scope_id": scope_id})
