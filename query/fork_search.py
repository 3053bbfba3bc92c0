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
from query.snapshot_search import nearest_statement
from query.snapshots import Pinned
from schemas.search import SearchRequest

_WRITTEN = "SELECT object_id FROM current_objects WHERE scope_id = %s"


async def forked_nearest(conn: psycopg.AsyncConnection[Any], space: SpaceRow, vector: list[float],
                         request: SearchRequest, fork: Fork, count: int, own: list[Any]) -> list[Any]:
    """The `count` nearest rows of the evaluation scope as it reads: `own` (its live search's rows) merged with
    its snapshot's members it has not written, in the rows' shape (meta, content, object_id, version_id,
    ledger_sequence, vector_version_id, distance, stale)."""
    base, watermark, members = fork
    written = {row[0] for row in await (await conn.execute(_WRITTEN, (request.scope_id,))).fetchall()}
    pin = Pinned({"snapshot_id": "", "scope_id": base, "ledger_sequence_high_watermark": watermark,
                  **({"included_object_ids": members} if members is not None else {})})
    wanted = count + len(written)  # the run's own objects may take places in the base's list: ask for more
    at_base = msgspec.structs.replace(request, scope_id=base)
    literal = vector_literal(vector)
    rows: list[Any] = []
    for shortlist in (max(6 * wanted, 60), max(60 * wanted, 600), None):
        statement = nearest_statement(space, literal, at_base, pin, wanted, shortlist)
        rows = await (await conn.execute(*statement)).fetchall()
        if len(rows) >= wanted:
            break
    inherited = [row for row in rows if row[2] not in written and math.isfinite(row[6])]
    merged = sorted([*own, *inherited], key=lambda row: (row[6], row[2], row[3]))
    return merged[:count]
