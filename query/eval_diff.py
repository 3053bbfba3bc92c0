"""Comparing a sealed snapshot with an evaluation scope (PAMSPEC 18.11): what a run changed.

`snapshot_diff` on an evaluation scope without `to_snapshot_id` compares snapshot A (`from_snapshot_id`, a
snapshot of the run's base scope) with the evaluation scope as it reads now: the run's snapshot overlaid by
what the run wrote (query.evaluation, copy on write). An object is `added` when only the evaluation scope
holds it, `removed` when only A does, `changed` when both hold it at other versions: its versions and
events from A's watermark to the run's snapshot's in the base scope (none when A is the run's snapshot),
then every version and event the run wrote of it. Pages as snapshot_diff's (bounded in objects and bytes).
Authorized on the evaluation scope, like reads through it.
"""

from __future__ import annotations

from typing import Any

import msgspec
import psycopg

from query.evaluation import run_of
from query.snapshot import snapshot
from query.snapshot_diff import _ENTRY_BYTES, _EVENTS, _VERSIONS, SnapshotDiffRequest, _event, _read, fill_page, \
    _version, prefix_within
from query.snapshots import pin_report, pinned
from schemas.canonical import canonical_bytes
from schemas.errors import InvalidRequest

_FOREVER = 2**63 - 1
# A's version and the evaluation scope's (its own, else its snapshot's) of each object, those that differ.
_MEMBERS = """WITH a AS (
  SELECT DISTINCT ON (object_id) object_id, version_id FROM memory_versions
  WHERE scope_id = %(base)s AND ledger_sequence <= %(wa)s AND object_id > %(after)s
    AND (%(ma)s::text[] IS NULL OR object_id = ANY(%(ma)s::text[]))
  ORDER BY object_id, sequence DESC
), e AS (
  SELECT DISTINCT ON (object_id) object_id, version_id FROM memory_versions
  WHERE scope_id = %(eval)s AND object_id > %(after)s ORDER BY object_id, sequence DESC
), s AS (
  SELECT DISTINCT ON (object_id) object_id, version_id FROM memory_versions
  WHERE scope_id = %(base)s AND ledger_sequence <= %(ws)s AND object_id > %(after)s
    AND (%(ms)s::text[] IS NULL OR object_id = ANY(%(ms)s::text[]))
  ORDER BY object_id, sequence DESC
), b AS (
  SELECT object_id, version_id, true AS own FROM e
  UNION ALL SELECT object_id, version_id, false FROM s WHERE NOT EXISTS (SELECT 1 FROM e WHERE e.object_id = s.object_id)
)
SELECT object_id, a.version_id, b.version_id, coalesce(b.own, false) FROM a FULL JOIN b USING (object_id)
WHERE a.version_id IS DISTINCT FROM b.version_id ORDER BY object_id LIMIT %(limit)s"""


async def evaluation_diff(conn: psycopg.AsyncConnection[Any], request: SnapshotDiffRequest) -> bytes:
    """One page of the comparison of snapshot A with the evaluation scope `request.scope_id` (module docstring)."""
    async with snapshot(conn):
        run = await run_of(conn, request.scope_id)
        if run is None:
            raise InvalidRequest("to_snapshot_id is required: this scope holds no evaluation run",
                                 details={"scope_id": request.scope_id, "field": "to_snapshot_id"})
        base = run["base_scope_id"]
        a = await pinned(conn, base, request.from_snapshot_id)
        s = await pinned(conn, base, run["snapshot_id"])
        cur = await conn.execute(_MEMBERS, {
            "base": base, "eval": request.scope_id, "after": request.after_object_id or "", "limit": request.limit,
            "wa": a.watermark, "ma": a.members, "ws": s.watermark, "ms": s.members})
        rows = await cur.fetchall()
        span = tuple(sorted((a.watermark, s.watermark)))

        def parts_of(own: bool) -> list[tuple[str, int, int]]:
            return [(base, *span)] + ([(request.scope_id, 0, _FOREVER)] if own else [])
        page = await fill_page(rows, lambda row, budget, cut: _changed(
            conn, row[0], (row[1], row[2]), parts_of(bool(row[3])), budget, cut))
        reports = {"from": await pin_report(conn, a),
                   "to": {"evaluation_scope_id": request.scope_id, "evaluation_run_id": run["run_id"],
                          "snapshot": await pin_report(conn, s)}}
    return canonical_bytes({"result": {
        "scope_id": request.scope_id, **reports,
        "direction": "forward" if a.watermark <= s.watermark else "backward",
        "added": page.added, "removed": page.removed, "changed": page.changed,
        "truncated": page.full or len(rows) == request.limit, "after_object_id": page.last}})


async def _changed(conn: psycopg.AsyncConnection[Any], object_id: str, held: tuple[str, str],
                   parts: list[tuple[str, int, int]], budget: int, cut: bool) -> tuple[dict[str, Any], int] | None:
    """As query.snapshot_diff's: the object's versions and events of each (scope, after, through) part in turn."""
    own = _ENTRY_BYTES + len(object_id) + len(held[0]) + len(held[1])
    versions: list[tuple[int, bytes]] = []
    events: list[tuple[int, bytes]] = []
    complete = True
    for scope_id, low, high in parts:
        params = (scope_id, object_id, low, high)
        found_v, whole_v = await _read(conn, "eval_diff_versions", _VERSIONS, params, budget - own, _version)
        found_e, whole_e = await _read(conn, "eval_diff_events", _EVENTS, params, budget - own, _event)
        versions += found_v
        events += found_e
        complete = complete and whole_v and whole_e
    size = own + sum(len(body) + 1 for _, body in versions) + sum(len(body) + 1 for _, body in events)
    complete = complete and size <= budget
    if not complete:
        if not cut:
            return None
        versions, events, size = prefix_within(versions, events, budget, own)
    entry = {"object_id": object_id, "from_version_id": held[0], "to_version_id": held[1],
             "versions": [msgspec.Raw(body) for _, body in versions],
             "events": [msgspec.Raw(body) for _, body in events], "complete": complete}
    return entry, size
