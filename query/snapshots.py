"""Reads at a sealed evaluation snapshot (schemas.snapshots), and the snapshots of a scope (list, show).

A snapshot answers what its scope held at its watermark (`ledger_sequence_high_watermark`), restricted to its
members when it names them, from the immutable versions: later writes never change its answers. Erasure
still wins: content erased (or hidden by a redaction) after the seal is absent, and every answer at a
snapshot says how many of its versions have lost content since it was sealed (`erased_since_seal`, a count,
never what was lost).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Any

import msgspec
import psycopg

from infra.ledger import hidden_by_latest, latest_version
from infra.lru import LRU
from infra.scopes import scope_exists
from schemas.canonical import canonical_bytes, decode_json
from schemas.common import Id
from schemas.errors import ScopeNotFound, SnapshotNotFound
from query.connections import Connections

_FIND = "SELECT descriptor, ledger_sequence FROM evaluation_snapshots WHERE snapshot_id = %s AND scope_id = %s"
_LIST = ("SELECT ledger_sequence, descriptor FROM evaluation_snapshots WHERE scope_id = %s AND ledger_sequence > %s"
         " ORDER BY ledger_sequence LIMIT %s")
# Versions visible at the watermark (each object's newest at or before it) with content when sealed, whose
# content is gone now or hidden by a later redaction. Only an object with a ledger entry after the watermark
# can have lost content since (content is erased, and hidden, only by an entry of its own object, in the
# transaction that appends it: command_handler.store), so only those objects are looked at: the count costs
# what changed since the seal, not the scope's size.
_LOST = """SELECT count(*) FROM (
  SELECT v.* FROM (SELECT DISTINCT object_id FROM ledger
                   WHERE scope_id = %s AND ledger_sequence > %s AND object_id IS NOT NULL) changed
  CROSS JOIN LATERAL (SELECT * FROM memory_versions w WHERE w.scope_id = %s AND w.object_id = changed.object_id
                      AND w.ledger_sequence <= %s ORDER BY w.sequence DESC LIMIT 1) v
  WHERE %s::text[] IS NULL OR v.object_id = ANY(%s::text[])) v
""" + latest_version("v") + """
WHERE v.content_digest IS NOT NULL AND ((""" + hidden_by_latest("v") + """)
      OR NOT EXISTS (SELECT 1 FROM content_store c WHERE c.content_digest = v.content_digest))"""


class SnapshotsRequest(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """One sealed snapshot of a scope (`snapshot_id`: show) or its snapshots in sealing order (list)."""

    scope_id: Id
    snapshot_id: Id | None = None
    after_sequence: Annotated[int, msgspec.Meta(ge=0, le=2**63 - 1)] = 0  # list: those sealed after this
    limit: Annotated[int, msgspec.Meta(ge=1, le=1000)] = 100
    operation_id: Annotated[str, msgspec.Meta(max_length=512)] | None = None


@dataclass(frozen=True)
class Pinned:
    """A snapshot as reads use it."""

    descriptor: dict[str, Any]
    sealed_sequence: int = 0  # the ledger entry that sealed it

    @property
    def watermark(self) -> int:
        return int(self.descriptor["ledger_sequence_high_watermark"])

    @property
    def members(self) -> list[str] | None:
        named = self.descriptor.get("included_object_ids")
        return list(named) if named is not None else None

    @property
    def spaces(self) -> list[str] | None:
        named = self.descriptor.get("included_embedding_space_ids")
        return list(named) if named is not None else None

    def holds(self, object_id: str) -> bool:
        members = self.members
        return members is None or object_id in members


async def pinned(conn: psycopg.AsyncConnection[Any], scope_id: str, snapshot_id: str) -> Pinned:
    """The sealed snapshot of this scope with this id; snapshot_not_found for any other (another scope's
    answers alike, so its existence never leaks)."""
    if not await scope_exists(conn, scope_id):
        raise ScopeNotFound("scope not found", details={"scope_id": scope_id})
    cur = await conn.execute(_FIND, (snapshot_id, scope_id))
    row = await cur.fetchone()
    if row is None:
        raise SnapshotNotFound("no sealed snapshot of this scope has this id", details={"snapshot_id": snapshot_id})
    return Pinned(decode_json(bytes(row[0])), int(row[1]))


class SealedSnapshots:
    """Sealed snapshots already found, by (scope_id, snapshot_id), so a read at one costs no look-up of it: a
    sealed snapshot never changes (a trigger refuses any change to its row), so one found stays right; one not
    found is asked for again (it may have been sealed since). One per query service (one database)."""

    def __init__(self, capacity: int = 1024):
        self._found: LRU[tuple[str, str], Pinned] = LRU(capacity)

    async def pin(self, pool: Connections, scope_id: str, snapshot_id: str) -> Pinned:
        found = self._found.get((scope_id, snapshot_id))
        if found is None:
            async with pool.connection() as conn:
                found = await pinned(conn, scope_id, snapshot_id)
            self._found.put((scope_id, snapshot_id), found)
        return found


def lost_statement(pin: Pinned) -> tuple[str, tuple[Any, ...]]:
    """The count of the snapshot's versions that lost content since the seal, as (SQL, parameters), for a
    caller that runs it in the same transaction as its rows."""
    members = pin.members
    scope_id = pin.descriptor["scope_id"]
    return _LOST, (scope_id, pin.watermark, scope_id, pin.watermark, members, members)


def report_of(pin: Pinned, lost: int) -> dict[str, Any]:
    """What every answer at a snapshot carries: which snapshot, its watermark, and how many of its versions
    lost content since it was sealed."""
    return {"snapshot_id": pin.descriptor["snapshot_id"], "ledger_sequence_high_watermark": pin.watermark,
            "erased_since_seal": lost}


async def pin_report(conn: psycopg.AsyncConnection[Any], pin: Pinned) -> dict[str, Any]:
    cur = await conn.execute(*lost_statement(pin))
    row = await cur.fetchone()
    return report_of(pin, int(row[0]) if row else 0)


async def snapshots(conn: psycopg.AsyncConnection[Any], request: SnapshotsRequest) -> bytes:
    """show (the descriptor) or list (descriptors in sealing order, one page)."""
    if request.snapshot_id is not None:
        pin = await pinned(conn, request.scope_id, request.snapshot_id)
        return canonical_bytes({"result": {"snapshot": pin.descriptor}})
    if not await scope_exists(conn, request.scope_id):
        raise ScopeNotFound("scope not found", details={"scope_id": request.scope_id})
    cur = await conn.execute(_LIST, (request.scope_id, request.after_sequence, request.limit))
    rows = await cur.fetchall()
    found = [{"ledger_sequence": r[0], "snapshot": msgspec.Raw(bytes(r[1]))} for r in rows]
    return canonical_bytes({"result": {"scope_id": request.scope_id, "snapshots": found,
                                       "more": len(rows) == request.limit}})
