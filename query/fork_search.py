"""Semantic search through an evaluation scope: the run's own objects and the snapshot's it has not written.

An evaluation scope holds only what its run wrote (query.evaluation); the objects of its snapshot it has not
written are read as the snapshot holds them. For semantic search that means: the scope's own nearest vectors
(the live search), and the snapshot's nearest members at its watermark ranked by the vectors kept per version
(query.snapshot_search.nearest_statement over the base scope), leaving out the objects the run has written
(their own versions answer for them); both lists merged by (distance, object_id, version_id). Lexical search
reads the same union as a query (query.plan.fork_sources).
"""

from __future__ import annotations

import math
from typing import Any

import msgspec
import psycopg

from embedding.store import SpaceRow, vector_literal
from query.evaluation import Fork
from query.snapshot_search import nearest_rows
from query.snapshots import Pinned
from schemas.search import SearchRequest

# Which of these objects the evaluation scope has written (their own versions answer for them).
_WRITTEN = "SELECT object_id FROM current_objects WHERE scope_id = %s AND object_id = ANY(%s)"


async def forked_nearest(conn: psycopg.AsyncConnection[Any], space: SpaceRow, vector: list[float],
                         request: SearchRequest, fork: Fork, count: int, own: list[Any]) -> list[Any]:
    """The `count` nearest rows of the evaluation scope as it reads: `own` (its live search's rows) merged with
    its snapshot's members it has not written, in the rows' shape (meta, content, object_id, version_id,
    ledger_sequence, vector_version_id, distance, stale). Only the base rows found are checked against the
    scope's writes; when those take places, a longer list is asked for (never a pass over the scope)."""
    base, watermark, members = fork
    pin = Pinned({"snapshot_id": "", "scope_id": base, "ledger_sequence_high_watermark": watermark,
                  **({"included_object_ids": members} if members is not None else {})})
    at_base = msgspec.structs.replace(request, scope_id=base)
    literal = vector_literal(vector)
    wanted = count
    while True:
        rows = await nearest_rows(conn, space, literal, at_base, pin, wanted)
        cur = await conn.execute(_WRITTEN, (request.scope_id, [row[2] for row in rows]))
        written = {row[0] for row in await cur.fetchall()}
        inherited = [row for row in rows if row[2] not in written and math.isfinite(row[6])]
        if len(inherited) >= count or len(rows) < wanted:
            break
        wanted *= 4
    merged = sorted([*own, *inherited], key=lambda row: (row[6], row[2], row[3]))
    return merged[:count]

