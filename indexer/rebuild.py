"""Fill a space from the current versions: a new space (a new model) or a rebuild, beside the live follower.

Why it is safe beside the follower: the follower embeds every version after the space's registration into
it; the fill covers what was current before. It starts from the indexer's checkpoint `start` (the space row
exists there, so every later version reaches the space live) and reads the indexer's own catalog
(indexer.catalog), written with that checkpoint, so it holds every version the live follower will not embed;
an object whose current version came after `start` is left to the follower (a fill under load used to chase
the objects being created, in key order, until the load ended, embedding each one twice). Writes never go back a
version (`upsert_vectors`), so the two may write one object in any order; and each fill batch writes under
the space's write lock, and only while the version's content still exists, so a fill racing a delete cannot
put an erased object's vector back (the follower erases under the same lock).

Only one fill of a space runs at a time (a session advisory lock: the indexer role and a CLI rebuild never
both fill it). Objects whose vector already names their current version are skipped, so a fill that was
stopped resumes cheaply. At the end the space is `ready` (with `filled_sequence`) and an `index_rebuilt`
{action: rebuild_completed} entry goes to the outbox, in one transaction.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import psycopg
from psycopg import sql

from embedding.embedders import Embedder
from embedding.store import (
    INDEX_CHECKPOINT, SpaceRow, VectorRow, mark_ready, upsert_vectors,
)
from indexer.catalog import COUNT_UPTO_SQL, PAGE_UPTO_SQL
from indexer.outbox import Entry, add_entries, entry_key
from indexer.texts import embed, read_contents, text_of
from infra import locks
from infra.projections import checkpoint
from schemas.common import SYSTEM_SCOPE


@dataclass(frozen=True)
class Progress:
    done: int  # current objects looked at
    total: int
    embedded: int
    seconds: float


@dataclass(frozen=True)
class FillReport:
    embedding_space_id: str
    filled_sequence: int
    total: int
    embedded: int
    seconds: float


class FillBusy(Exception):
    """Another process is filling this space right now."""


async def fill_space(conn: psycopg.AsyncConnection[Any], space: SpaceRow, embedder: Embedder, batch: int = 64,
                     progress: Callable[[Progress], None] | None = None) -> FillReport:
    """Fill `space` (see the module docstring) on an autocommit connection; raises FillBusy when another
    fill holds the space."""
    lock = locks.space_fill_key(space.space_key)
    got = await (await conn.execute("SELECT pg_try_advisory_lock(%s)", (lock,))).fetchone()
    if not (got and got[0]):
        raise FillBusy(space.embedding_space_id)
    try:
        return await _fill(conn, space, embedder, batch, progress)
    finally:
        await conn.execute("SELECT pg_advisory_unlock(%s)", (lock,))


async def _fill(conn: psycopg.AsyncConnection[Any], space: SpaceRow, embedder: Embedder, batch: int,
                progress: Callable[[Progress], None] | None) -> FillReport:
    started = time.monotonic()
    start = max(await checkpoint(conn, INDEX_CHECKPOINT), space.registered_sequence)
    total = int((await (await conn.execute(COUNT_UPTO_SQL, (start,))).fetchone() or (0,))[0])
    done = embedded = 0
    after = ("", "")
    while True:
        rows = await (await conn.execute(PAGE_UPTO_SQL, (start, *after, batch))).fetchall()
        if not rows:
            break
        after = (rows[-1][0], rows[-1][1])
        embedded += await _fill_page(conn, space, embedder, batch, rows)
        done += len(rows)
        if progress is not None:
            progress(Progress(done, total, embedded, time.monotonic() - started))
    report = FillReport(space.embedding_space_id, start, done, embedded, time.monotonic() - started)
    async with conn.transaction():
        await mark_ready(conn, space.embedding_space_id, start)
        await add_entries(conn, [Entry(SYSTEM_SCOPE, "index_rebuilt", entry_key("rebuilt", space.space_key, start), {
            "action": "rebuild_completed", "embedding_space_id": space.embedding_space_id,
            "space_digest": space.space_digest, "count": embedded, "objects": done, "filled_sequence": start})])
    return report


async def _fill_page(conn: psycopg.AsyncConnection[Any], space: SpaceRow, embedder: Embedder, batch: int,
                     rows: list[Any]) -> int:
    """Embed and write one page of current objects; returns how many vectors it wrote."""
    cur = await conn.execute(sql.SQL(
        "SELECT t.version_id FROM {} t JOIN unnest(%s::text[], %s::text[]) AS d(scope_id, object_id)"
        " ON t.scope_id = d.scope_id AND t.object_id = d.object_id").format(space.table),
        ([r[0] for r in rows], [r[1] for r in rows]))
    have = {r[0] for r in await cur.fetchall()}
    todo = [r for r in rows if r[2] not in have]
    contents = await read_contents(conn, [r[2] for r in todo])
    texts = {r[2]: text_of(r[5], contents[r[2]]) for r in todo if r[2] in contents}
    wanted = [r for r in todo if r[2] in texts and texts[r[2]].text]
    if not wanted:
        return 0
    made = await embed(embedder, [texts[r[2]] for r in wanted], batch)
    vectors = [VectorRow(r[0], r[1], r[2], r[3], r[4], e.truncated, e.vector, r[6])
               for r, e in zip(wanted, made, strict=True)]
    async with conn.transaction():
        await conn.execute("SELECT pg_advisory_xact_lock(%s)", (locks.space_write_key(space.space_key),))
        await upsert_vectors(conn, space, vectors, require_content=True)
    return len(vectors)
