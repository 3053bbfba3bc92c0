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

from embedding.embedders import hashing_space
from embedding.store import find_space, vector_literal
from infra.settings import QuerySettings
from pamledger_client.client import MemoryClient
from query.hybrid import run_search
from query.search import CheckpointWatcher
from query.semantic import hnsw_statement
from schemas.search import decode_search
from tests.conftest import ACTOR, PROVENANCE, Env
from tests.integration.search_vectors import write_vectors

pytestmark = pytest.mark.profile("PAMSPEC-Semantic-Query")  # docs/implementation-report.md

DIMS = 16
SPACE = hashing_space(DIMS)
SMALL, BIG = "workspace:hnsw-small", "workspace:hnsw-big"


def clustered(rng: random.Random, n: int) -> list[list[float]]:
    """Points around 8 centres (never uniform noise: real embeddings cluster)."""
    centres = [[rng.gauss(0, 1) for _ in range(DIMS)] for _ in range(8)]
    return [[c + rng.gauss(0, 0.3) for c in rng.choice(centres)] for _ in range(n)]


async def fill(client: MemoryClient, scope: str, count: int, rare: int = 0) -> list[str]:
    """`count` corroborated objects, every `rare`-th of them (if any) unverified instead."""
    await client.create_scope(scope)
    made: list[str] = []
    for start in range(0, count, 50):
        batch = await asyncio.gather(*(client.create(
            scope, "claim", {"statement": f"point {i}"}, ACTOR, PROVENANCE,
            validation_state="unverified" if rare and i % rare == 0 else "corroborated")
            for i in range(start, min(count, start + 50))))
        made += [b["object_id"] for b in batch]
    return made


@pytest.fixture(scope="module")
async def pool(service: Env, client: MemoryClient) -> Any:
    rng = random.Random(7)
    small, big = await fill(client, SMALL, 40), await fill(client, BIG, 600, rare=40)
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


async def search(pool: Any, settings: QuerySettings, vector: list[float], scope: str = SMALL,
                 **filters: Any) -> dict[str, Any]:
    request = decode_search(msgspec.json.encode({"scope_id": scope, "vector": vector, "mode": "semantic",
                                                 "limit": 10, **filters}))
    reply = await run_search(pool, CheckpointWatcher(), CheckpointWatcher(), request, settings)
    return json.loads(reply)["result"]


@pytest.mark.parametrize("scope", [SMALL, BIG])
async def test_hnsw_and_exact_give_the_same_top_k(pool: Any, scope: str) -> None:
    rng = random.Random(11)
    hnsw_settings = QuerySettings(search_exact_threshold=10, search_mid_threshold=0)
    mid_settings = QuerySettings(search_exact_threshold=10, search_mid_threshold=100_000)  # a "mid-size" scope
    for vector in clustered(rng, 10):
        exact = await search(pool, QuerySettings(), vector, scope)
        assert exact["index"]["method"] == "exact" and exact["index"]["approximate"] is False
        for settings, ef_search in ((hnsw_settings, 400), (mid_settings, 1000)):
            approx = await search(pool, settings, vector, scope)
            assert approx["index"] == {**approx["index"], "method": "hnsw", "approximate": True, "ef_search": ef_search}
            assert [i["object_id"] for i in approx["items"]] == [i["object_id"] for i in exact["items"]]
            scores = [i["semantic_score"] for i in approx["items"]]
            assert scores == sorted(scores, reverse=True) and len(scores) == 10


async def test_a_filter_few_rows_pass_still_gets_its_true_neighbours_through_hnsw(pool: Any) -> None:
    """15 of 640 vectors pass: a plain HNSW scan (ef_search 100 candidates, filtered afterwards) would
    return only the few of them among the 100 nearest; the iterative scan goes on until 10 pass."""
    rng = random.Random(13)
    rare = {"validation_states": ["unverified"]}
    for vector in clustered(rng, 5):
        exact = await search(pool, QuerySettings(), vector, BIG, **rare)
        narrow = QuerySettings(search_exact_threshold=10, search_ef_search=20, search_mid_threshold=0)
        approx = await search(pool, narrow, vector, BIG, **rare)
        assert approx["index"]["method"] == "hnsw" and len(exact["items"]) == 10
        assert [i["object_id"] for i in approx["items"]] == [i["object_id"] for i in exact["items"]]


async def hnsw_rows(pool: Any, vector: list[float], iterative: str, sort: str = "off",
                    **filters: Any) -> tuple[list[str], str]:
    """hnsw_statement as search runs it (`sort` "off" prices sorting out, so the HNSW index must produce the
    order): the object ids it returns and the plan, in which the index is named `index:`."""
    request = decode_search(msgspec.json.encode({"scope_id": BIG, "vector": vector, **filters}))
    async with pool.connection() as conn:
        async with conn.transaction():
            space = await find_space(conn, SPACE.embedding_space_id)
            assert space is not None
            for name, value in (("enable_sort", sort), ("hnsw.ef_search", "20"), ("hnsw.iterative_scan", iterative)):
                await conn.execute("SELECT set_config(%s, %s, true)", (name, value))
            statement, params = hnsw_statement(space, vector_literal(vector), request, 10, 20)
            plan = await (await conn.execute(b"EXPLAIN " + statement.as_bytes(conn), params)).fetchall()
            rows = await (await conn.execute(statement, params)).fetchall()
    text = "\n".join(r[0] for r in plan)
    return [r[2] for r in rows], text.replace(f"embedding_vectors_{space.space_key}_hnsw", "index:")


async def test_the_hnsw_statement_needs_the_iterative_scan_to_fill_a_rare_filter(pool: Any) -> None:
    """Through the index itself: without iterative scans the 20 candidates of ef_search, filtered to the
    scope and to 15 rare rows of 640, leave fewer than 10; with them, exactly the exact search's 10."""
    vector = clustered(random.Random(17), 1)[0]
    rare = {"validation_states": ["unverified"]}
    exact = await search(pool, QuerySettings(), vector, BIG, **rare)
    found, plan = await hnsw_rows(pool, vector, "relaxed_order", **rare)
    assert "index:" in plan, plan
    assert found == [i["object_id"] for i in exact["items"]]
    plain, _ = await hnsw_rows(pool, vector, "off", **rare)
    assert len(plain) < 10


async def test_with_statistics_the_planner_itself_takes_the_index_for_a_large_scope(pool: Any) -> None:
    _, plan = await hnsw_rows(pool, [1.0] * DIMS, "relaxed_order", sort="on")
    assert "index:" in plan, plan
