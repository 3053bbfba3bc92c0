"""The indexer with the real model as its default space (the production default): 384-dimension vectors,
and a text the profile keeps whole but the model's 256-piece window cuts is stored as truncated.

Why one test with the model: every other indexer test uses a hashing space to stay fast, so this is where
the default configuration (`PAMLEDGER_INDEXER__DEFAULT_SPACE=minilm`) and the window's report are checked.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import psycopg
import pytest

from embedding.embedders import minilm_space
from embedding.store import find_space
from infra.settings import IndexerSettings
from pamledger.supervisor import ROLES as ALL_ROLES
from tests.conftest import ACTOR, PROVENANCE, Env, Servers, fresh_database, fresh_settings, serving, wait_for
from tests.integration.test_indexer import indexed_through

pytestmark = pytest.mark.model
SCOPE = "workspace:model"


@pytest.fixture(scope="module")
def env(servers: Servers) -> Env:
    return Env(servers, fresh_database(servers, "indexer_minilm"),
               fresh_settings("indexer_minilm", indexer=IndexerSettings(default_space="minilm", model_threads=1)))


@pytest.fixture(scope="module")
async def client(env: Env) -> AsyncIterator[Any]:
    async with serving(env, ALL_ROLES, roles=ALL_ROLES) as client:
        await client.create_scope(SCOPE)
        yield client


async def test_the_model_space_is_the_default_and_reports_the_window_cut(env: Env, client: Any) -> None:
    await wait_for(lambda: indexed_through(env, 0), timeout=120)
    short = await client.create(SCOPE, "claim", {"statement": "Persistent memory outlives the session."}, ACTOR,
                                PROVENANCE)
    long = await client.create(SCOPE, "claim", {"statement": "memory " * 600}, ACTOR, PROVENANCE)  # < 4096 chars
    await wait_for(lambda: indexed_through(env, long["ledger_sequence"]), timeout=120)
    async with await psycopg.AsyncConnection.connect(env.database_url, autocommit=True) as conn:
        space = await find_space(conn, None)
        assert space is not None and space.embedding_space_id == minilm_space().embedding_space_id
        cur = await conn.execute(f"SELECT object_id, truncated, vector_dims(embedding) FROM {space.table.as_string()}")
        rows = {r[0]: (r[1], r[2]) for r in await cur.fetchall()}
    assert rows[short["object_id"]] == (False, 384)
    assert rows[long["object_id"]] == (True, 384)
