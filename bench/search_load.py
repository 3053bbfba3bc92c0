"""Load the search benchmark's vectors into one space table and build its HNSW index, timing each part.

Why measure both orders: `create_space` makes the HNSW index on the empty table, which is right for the
indexer (rows arrive a batch at a time) but a bulk load through a live HNSW index inserts every row into
the graph one by one. A probe COPYs the first rows with the index present; then the table is emptied, the
index dropped, every row COPYed and the index built once with `maintenance_work_mem` large enough to hold
the graph (otherwise pgvector's build falls back to on-disk inserts) and one parallel worker (2 cores).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import psycopg
from psycopg import sql

from bench.search_data import copy_chunks
from embedding.embedders import minilm_space
from embedding.store import create_space
from schemas.embedding import encode_space, space_digest

COPY_COLUMNS = "(scope_id, object_id, version_id, version_sequence, ledger_sequence, truncated, embedding)"


@dataclass
class Timings:
    rows: int
    probe_rows: int = 0
    probe_with_index_s: float = 0.0
    copy_s: float = 0.0
    build_s: float = 0.0
    analyze_s: float = 0.0
    maintenance_work_mem: str = ""
    build_workers: int = 0
    index: str = ""  # the parameters the index was built with


@dataclass
class Loaded:
    table: sql.Identifier
    index_name: str
    timings: Timings
    sizes: dict[str, int] = field(default_factory=dict)


async def _copy(conn: psycopg.AsyncConnection[object], table: sql.Identifier, vectors: np.ndarray,
                scopes: list[str], stop: int) -> float:
    began = time.perf_counter()
    async with conn.cursor() as cur:
        statement = sql.SQL("COPY {} " + COPY_COLUMNS + " FROM STDIN (FORMAT BINARY)").format(table)
        async with cur.copy(statement) as copy:
            for chunk in copy_chunks(vectors, scopes, 0, stop):
                await copy.write(chunk)
    return time.perf_counter() - began


async def load(url: str, vectors: np.ndarray, scopes: list[str], probe: int, maintenance_work_mem: str,
               build_workers: int, log: Callable[[str], None], graph: tuple[int, int] | None = None) -> Loaded:
    """Register the MiniLM space (registry row, table, HNSW index), probe, bulk load, build, analyze.

    `graph` = (m, ef_construction) rebuilds the index with other parameters than create_space's (an
    experiment: what a denser graph buys in recall and costs in build time)."""
    space = minilm_space()
    timings = Timings(len(vectors), maintenance_work_mem=maintenance_work_mem, build_workers=build_workers)
    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
        row = await create_space(conn, space, encode_space(space), space_digest(space), 0)
        assert row is not None
        table, table_name = row.table, f"embedding_vectors_{row.space_key}"
        index_name = f"{table_name}_hnsw"
        cur = await conn.execute("SELECT indexdef FROM pg_indexes WHERE indexname = %s", (index_name,))
        found = await cur.fetchone()
        assert found is not None, "create_space made no HNSW index"
        definition = found[0]
        if graph is not None:
            definition = sql.SQL(
                "CREATE INDEX {} ON {} USING hnsw (embedding vector_cosine_ops) WITH (m = {}, ef_construction = {})"
            ).format(sql.Identifier(index_name), table, sql.Literal(graph[0]), sql.Literal(graph[1])).as_string(conn)
        timings.probe_rows = min(probe, len(vectors))
        if timings.probe_rows:
            log(f"probe: COPY of {timings.probe_rows:,} rows with the HNSW index present ...")
            timings.probe_with_index_s = await _copy(conn, table, vectors, scopes, timings.probe_rows)
            await conn.execute(sql.SQL("TRUNCATE {}").format(table))
        await conn.execute(sql.SQL("DROP INDEX {}").format(sql.Identifier(index_name)))
        log(f"COPY of {len(vectors):,} rows without the index ...")
        timings.copy_s = await _copy(conn, table, vectors, scopes, len(vectors))
        await conn.execute(sql.SQL("SET maintenance_work_mem = {}").format(sql.Literal(maintenance_work_mem)))
        await conn.execute(sql.SQL("SET max_parallel_maintenance_workers = {}").format(sql.Literal(build_workers)))
        timings.index = definition.split(" USING ")[1]
        log(f"building the HNSW index ({timings.index}) ...")
        began = time.perf_counter()
        await conn.execute(definition)
        timings.build_s = time.perf_counter() - began
        began = time.perf_counter()
        await conn.execute(sql.SQL("VACUUM ANALYZE {}").format(table))
        timings.analyze_s = time.perf_counter() - began
        cur = await conn.execute("SELECT pg_relation_size(%s::regclass), pg_total_relation_size(%s::regclass),"
                                 " pg_relation_size(%s::regclass)", (table_name, table_name, index_name))
        sizes = await cur.fetchone()
        assert sizes is not None
    return Loaded(table, index_name, timings, {"table_bytes": sizes[0], "table_total_bytes": sizes[1],
                                               "hnsw_bytes": sizes[2]})
