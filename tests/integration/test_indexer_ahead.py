"""The indexer step prepared ahead: batch k+1 prepared while batch k is not yet written still writes only what
is true once both committed (infra.prepare_ahead, indexer.step).

Why drive the step by hand: the follower prepares ahead only when the next batch is already buffered, so
whether a test hits the interleaving would be timing; here the order is fixed: prepare k, prepare k+1 ahead
of k, write k, write k+1, on real Postgres with the ledger the writer made.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import msgspec
import psycopg
import pytest
from psycopg import sql

from embedding.embedders import hashing_space
from embedding.store import SpaceRow, create_space
from indexer.plan import DefaultSwitch, Plan
from indexer.step import IndexerStep, Prepared
from infra.projections import PROJECTION, checkpoint
from schemas.embedding import encode_space, space_digest
from tests.conftest import ACTOR, PROVENANCE, Env, serving, wait_for

SCOPE = "workspace:ahead"
SPACE = hashing_space(24)


async def _events(conn: psycopg.AsyncConnection[Any], object_id: str) -> list[tuple[int, bytes]]:
    cur = await conn.execute("SELECT ledger_sequence, event FROM ledger WHERE object_id = %s ORDER BY 1",
                             (object_id,))
    return [(int(r[0]), bytes(r[1])) for r in await cur.fetchall()]


async def _vector(conn: psycopg.AsyncConnection[Any], space: SpaceRow, object_id: str) -> tuple[str, str]:
    cur = await conn.execute(sql.SQL("SELECT version_id, embedding::text FROM {} WHERE object_id = %s"
                                     ).format(space.table), (object_id,))
    row = await cur.fetchone()
    assert row is not None
    return row[0], row[1]


async def _write(conn: psycopg.AsyncConnection[Any], step: IndexerStep, batch: list[tuple[int, bytes]],
                 prepared: Prepared) -> None:
    async with conn.transaction():
        await step.apply_prepared(conn, batch, prepared)


def _with_digest(event: tuple[int, bytes], like: tuple[int, bytes]) -> tuple[int, bytes]:
    """`event` naming `like`'s content digest. The writer salts every new content, so today a digest comes
    back only through a transition (of the version just before); the step must not depend on that: a
    digest that recurs (content restored under its old digest) is the case where a stale read would move."""
    value, other = msgspec.json.decode(event[1]), msgspec.json.decode(like[1])
    value["payload"]["content_digest"] = other["payload"]["content_digest"]
    return event[0], msgspec.json.encode(value)


@pytest.fixture(scope="module")
async def reverted(env: Env) -> AsyncIterator[tuple[str, list[str]]]:
    """An object whose third version has its first version's content again: (object id, version ids)."""
    async with serving(env) as client:
        await client.create_scope(SCOPE)
        made = await client.create(SCOPE, "claim", {"statement": "the cat sat on the mat"}, ACTOR, PROVENANCE)
        oid = made["object_id"]
        changed = await client.update(SCOPE, oid, made["version_id"], {"statement": "dogs bark at night"},
                                      ACTOR, PROVENANCE)
        back = await client.update(SCOPE, oid, changed["version_id"], {"statement": "the cat sat on the mat"},
                                   ACTOR, PROVENANCE)

        async def projected() -> bool:
            async with await psycopg.AsyncConnection.connect(env.database_url, autocommit=True) as conn:
                return await checkpoint(conn, PROJECTION) >= back["ledger_sequence"]

        await wait_for(projected, timeout=30)
        yield oid, [made["version_id"], changed["version_id"], back["version_id"]]


async def test_a_batch_prepared_ahead_of_one_that_rewrites_its_object_embeds_instead_of_moving(
        env: Env, reverted: tuple[str, list[str]]) -> None:
    oid, versions = reverted
    async with await psycopg.AsyncConnection.connect(env.database_url, autocommit=True) as writing, \
            await psycopg.AsyncConnection.connect(env.database_url, autocommit=True) as preparing:
        async with writing.transaction():
            space = await create_space(writing, SPACE, encode_space(SPACE), space_digest(SPACE), 1)
        assert space is not None
        first, second, third = ([e] for e in await _events(preparing, oid))
        third = [_with_digest(third[0], first[0])]
        step = IndexerStep()
        await _write(writing, step, first, await step.prepare(preparing, first, None) or Prepared(Plan(), []))
        version, original = await _vector(writing, space, oid)
        assert version == versions[0]

        # Batch k (the other content) is prepared; k+1 (the first content again, under its first digest) is
        # prepared before k is written: the vector it reads still names that digest, which k is about to
        # replace, so a move decided on it would find nothing to move once k committed.
        k = await step.prepare(preparing, second, None)
        assert k is not None
        ahead = await step.prepare(preparing, third, k)
        assert ahead is not None
        await _write(writing, step, second, k)
        await _write(writing, step, third, ahead)
        assert await _vector(writing, space, oid) == (versions[2], original)


async def test_nothing_is_prepared_ahead_of_a_batch_with_a_registry_entry(env: Env, reverted: Any) -> None:
    oid, _ = reverted
    async with await psycopg.AsyncConnection.connect(env.database_url, autocommit=True) as conn:
        batch = (await _events(conn, oid))[:1]
        pending = Prepared(Plan(registry=[DefaultSwitch(1, SPACE.embedding_space_id)]), [])
        assert await IndexerStep().prepare(conn, batch, pending) is None
        assert await IndexerStep().prepare(conn, batch, None) is not None


async def test_what_was_prepared_for_other_events_is_never_written(env: Env, reverted: Any) -> None:
    oid, _ = reverted
    async with await psycopg.AsyncConnection.connect(env.database_url, autocommit=True) as conn:
        events = await _events(conn, oid)
        step = IndexerStep()
        prepared = await step.prepare(conn, events[:1], None)
        assert prepared is not None
        with pytest.raises(RuntimeError):
            await _write(conn, step, events[1:2], prepared)
