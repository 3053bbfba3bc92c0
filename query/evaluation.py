"""Reads through an evaluation scope (schemas.evaluation): the run's fork of a sealed snapshot.

An evaluation scope holds only what its run wrote; an object it has not written is read as the run's snapshot
holds it (its base scope at the watermark, members only), copy on write: the writer's first write of such an
object in the run takes that version as its base. Read and history fall back this way; a live query and a
lexical search read the union (query.plan.fork_sources); a semantic search merges the scope's own nearest with
the snapshot's (query.fork_search); related answers the evaluation scope's own objects only.
"""

from __future__ import annotations

from typing import Any

import psycopg

from infra.lru import LRU
from infra.scopes import scope_exists
from query.connections import Connections
from query.snapshots import Pinned, pinned
from schemas.canonical import decode_json

Fork = tuple[str, int, list[str] | None]  # the base scope, the snapshot's watermark, its members (None: all)

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


class Forks:
    """Which scopes are evaluation scopes and what they fork, asked once per scope: a run's fork never changes,
    and a scope that exists without a run never gets one (eval_start makes a new scope). A scope that does not
    exist yet is asked again next time."""

    def __init__(self, capacity: int = 10_000) -> None:
        self.known: LRU[str, tuple[Fork | None]] = LRU(capacity)

    async def of(self, pool: Connections, scope_id: str) -> Fork | None:
        cached = self.known.get(scope_id)
        if cached is not None:
            return cached[0]
        async with pool.connection() as conn:
            run = await run_of(conn, scope_id)
            fork: Fork | None = None
            if run is not None:
                pin = await pinned(conn, run["base_scope_id"], run["snapshot_id"])
                fork = (run["base_scope_id"], pin.watermark, pin.members)
            if fork is not None or await scope_exists(conn, scope_id):
                self.known.put(scope_id, (fork,))
        return fork
