"""Reads through an evaluation scope (schemas.evaluation): the run's fork of a sealed snapshot.

An evaluation scope holds only what its run wrote; an object it has not written is read as the run's snapshot
holds it (its base scope at the watermark, members only), copy on write: the writer's first write of such an
object in the run takes that version as its base. Read and history fall back this way; query and search do
not (they answer the evaluation scope's own objects).
"""

from __future__ import annotations

from typing import Any

import psycopg

from query.snapshots import Pinned, pinned
from schemas.canonical import decode_json

_RUN = "SELECT record FROM evaluation_runs WHERE scope_id = %s"


async def run_of(conn: psycopg.AsyncConnection[Any], scope_id: str) -> dict[str, Any] | None:
    """The evaluation run of `scope_id` (its record: run_id, snapshot_id, base_scope_id, ...), or None."""
    cur = await conn.execute(_RUN, (scope_id,))
    row = await cur.fetchone()
    return decode_json(bytes(row[0])) if row is not None else None


async def fork_of(conn: psycopg.AsyncConnection[Any], scope_id: str, object_id: str) -> tuple[str, Pinned] | None:
    """(base scope, its pinned snapshot) when `scope_id` is an evaluation scope whose snapshot holds the
    object, else None."""
    run = await run_of(conn, scope_id)
    if run is None:
        return None
    pin = await pinned(conn, run["base_scope_id"], run["snapshot_id"])
    return (run["base_scope_id"], pin) if pin.holds(object_id) else None
