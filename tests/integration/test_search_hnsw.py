"""Exact and HNSW search agree on a small scope inside a larger table, and HNSW is what answers.

Why: a scope above `search_exact_threshold` vectors goes through the HNSW index with an iterative scan
and an exact re-rank; a scope of 40 among 640 must still get the same true top k as the exact search.
"""

from __future__ import annotations

import asyncio
import json
import random
from typing import Any

import msgspec
from psycopg import sql
import pytest
from psycopg_pool import AsyncConnectionPool

from infra.embedding.embedders import hashing_space
from infra.embedding.store import find_space
from infra.settings import QuerySettings
from memory_client.client import MemoryClient
from query.hybrid import run_search
from query.search import CheckpointWatcher
from query.semantic import hnsw_statement
from schemas.search import decode_search
from tests.conftest import ACTOR, PROVENANCE, Env
from tests.integration.search_vectors import write_vectors

DIMS = 16
SPACE = hashing_space(DIMS)
SMALL, BIG = "workspace:hnsw-small", "workspace:hnsw-big"


def clustered(rng: random.Random, n: int) -> list[list[float]]:
    """Points around 8 centres (never uniform noise: real embeddings cluster)."""
    centres = [[rng.gauss(0, 1) for _ in range(DIMS)] for _ in range(8)]
    return [[c + rng.gauss(0, 0.3) for c in rng.choice(centres)] for _ in range(n)]


async def fill(client: MemoryClient, scope: str, count: int) -> list[str]:
    await client.create_scope(scope)
    made: list[str] = []
    for start in range(0, count, 50):
        batch = await asyncio.gather(*(client.create(scope, "claim", {"statement": f"point {i}"}, ACTOR, PROVENANCE,
                                                     validation_state="corroborated")
                                       for i in range(start, min(count, start + 50))))
        made += [b["object_id"] for b in batch]
    return made


@pytest.fixture(scope="module")
async def pool(service: Env, client: MemoryClient) -> Any:
    rng = random.Random(7)
    small, big = await fill(client, SMALL, 40), await fill(client, BIG, 600)
    await write_vectors(service, SPACE, BIG, vectors=dict(zip(big, clustered(rng, len(big)))))
    await write_vectors(service, SPACE, SMALL, vectors=dict(zip(small, clustered(rng, len(small)))))
    p = AsyncConnectionPool(service.database_url, min_size=1, max_size=2, open=False, kwargs={"autocommit": True})
    await p.open()
    async with p.connection() as conn:  # the statistics autovacuum would gather, so the planner sees 640 rows
        await conn.execute("ANALYZE current_objects")
        space = await find_space(conn, SPACE.embedding_space_id)
        assert space is not None
        await conn.execute(sql.SQL("ANALYZE {}").format(space.table))
    yield p
    await p.close()


async def search(pool: Any, settings: QuerySettings, vector: list[float], scope: str = SMALL) -> dict[str, Any]:
    request = decode_search(msgspec.json.encode({"scope_id": scope, "vector": vector, "mode": "semantic",
                                                 "limit": 10}))
    reply = await run_search(pool, CheckpointWatcher(), CheckpointWatcher(), request, settings)
    return json.loads(reply)["result"]


@pytest.mark.parametrize("scope", [SMALL, BIG])
async def test_hnsw_and_exact_give_the_same_top_k(pool: Any, scope: str) -> None:
    rng = random.Random(11)
    hnsw_settings = QuerySettings(search_exact_threshold=10)
    for vector in clustered(rng, 10):
        exact = await search(pool, QuerySettings(), vector, scope)
        approx = await search(pool, hnsw_settings, vector, scope)
        assert exact["index"]["method"] == "exact" and exact["index"]["approximate"] is False
        assert approx["index"] == {**approx["index"], "method": "hnsw", "approximate": True, "ef_search": 100}
        assert [i["object_id"] for i in approx["items"]] == [i["object_id"] for i in exact["items"]]
        scores = [i["semantic_score"] for i in approx["items"]]
        assert scores == sorted(scores, reverse=True) and len(scores) == 10


async def test_the_hnsw_path_uses_the_index_with_an_iterative_scan(pool: Any) -> None:
    async with pool.connection() as conn:
        async with conn.transaction():
            space = await find_space(conn, SPACE.embedding_space_id)
            assert space is not None
            await conn.execute("SELECT set_config('hnsw.iterative_scan', 'relaxed_order', true)")
            request = decode_search(msgspec.json.encode({"scope_id": BIG, "vector": [1.0] * DIMS}))
            statement, params = hnsw_statement(space, "[" + ",".join(["1"] * DIMS) + "]", request, 10, 100)
            plan = await (await conn.execute(b"EXPLAIN " + statement.as_bytes(conn), params)).fetchall()
    text = "\n".join(r[0] for r in plan)
    assert f"embedding_vectors_{space.space_key}_hnsw" in text, text
