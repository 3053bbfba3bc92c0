"""The indexer follower: vectors per space naming their version, moves without re-embedding, erasure in every
space, the default space at start, a later space filled beside the first, and its ledger entries sent once.

Why real servers: what matters is what the tables and the ledger hold after the follower's transactions,
the outbox's sends and a fill racing the live follower.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import AsyncIterator
from typing import Any

import msgspec
import psycopg
import pytest
from psycopg import sql

from embedding.embedders import hashing_space
from embedding.store import INDEX_CHECKPOINT, find_space, list_spaces
from infra.projections import checkpoint
from infra.requester import CommandRequester
from pamledger.runtime import connect_nats
from pamledger.supervisor import ROLES as ALL_ROLES
from schemas.common import SYSTEM_SCOPE
from tests.conftest import ACTOR, PROVENANCE, TEST_SPACE, Env, serving, wait_for

SCOPE = "workspace:indexed"
SERVICE_ACTOR = {"actor_id": "service:tester", "actor_kind": "service"}
SECOND = hashing_space(32)


async def sql_rows(env: Env, query: Any, params: Any = ()) -> list[tuple[Any, ...]]:
    async with await psycopg.AsyncConnection.connect(env.database_url, autocommit=True) as conn:
        return [tuple(r) for r in await (await conn.execute(query, params)).fetchall()]


async def vectors(env: Env, space_id: str) -> dict[str, tuple[str, bool, str]]:
    """object_id → (version_id, truncated, embedding text) of one space's table."""
    async with await psycopg.AsyncConnection.connect(env.database_url, autocommit=True) as conn:
        space = await find_space(conn, space_id)
        assert space is not None, f"space {space_id} not projected"
        cur = await conn.execute(sql.SQL("SELECT object_id, version_id, truncated, embedding::text FROM {}"
                                         ).format(space.table))
        return {r[0]: (r[1], r[2], r[3]) for r in await cur.fetchall()}


async def all_vector_rows(env: Env, object_id: str) -> int:
    async with await psycopg.AsyncConnection.connect(env.database_url, autocommit=True) as conn:
        total = 0
        for space in await list_spaces(conn):
            cur = await conn.execute(sql.SQL("SELECT count(*) FROM {} WHERE object_id = %s").format(space.table),
                                     (object_id,))
            total += (await cur.fetchone() or (0,))[0]
        return total


async def generated(env: Env) -> list[dict[str, Any]]:
    rows = await sql_rows(env, "SELECT event FROM ledger WHERE event_type = 'embedding_generated' ORDER BY ledger_sequence")
    return [msgspec.json.decode(bytes(r[0]))["payload"] for r in rows]


async def indexed_through(env: Env, sequence: int) -> bool:
    """The indexer has applied the ledger through `sequence`, its default space is registered and filled, and
    its outbox is empty."""
    async with await psycopg.AsyncConnection.connect(env.database_url, autocommit=True) as conn:
        outbox = (await (await conn.execute("SELECT count(*) FROM index_outbox")).fetchone() or (0,))[0]
        default = await find_space(conn, None)
        return (await checkpoint(conn, INDEX_CHECKPOINT) >= sequence and outbox == 0 and default is not None
                and default.state == "ready")


async def head(env: Env) -> int:
    return int((await sql_rows(env, "SELECT coalesce(max(ledger_sequence), 0) FROM ledger"))[0][0])


@pytest.fixture(scope="module")
async def indexed(env: Env) -> AsyncIterator[Any]:
    async with serving(env, ALL_ROLES, roles=ALL_ROLES) as client:
        await client.create_scope(SCOPE)
        yield client


@pytest.fixture(scope="module")
async def writer(indexed: Any, env: Env) -> AsyncIterator[CommandRequester]:
    nc = await connect_nats(env.nats_url, "test-indexer")
    yield CommandRequester(nc, env.settings.subject_prefix, retries=3)
    await nc.close()


async def test_the_configured_space_is_registered_ready_and_default_at_start(env: Env, indexed: Any) -> None:
    async def ready() -> Any:
        async with await psycopg.AsyncConnection.connect(env.database_url, autocommit=True) as conn:
            space = await find_space(conn, None)
            return space if space is not None and space.state == "ready" else None

    space = await wait_for(ready, timeout=30)
    assert space.embedding_space_id == hashing_space(int(TEST_SPACE.split("-")[1])).embedding_space_id
    entries = await sql_rows(env, "SELECT event FROM ledger WHERE scope_id = %s ORDER BY ledger_sequence", (SYSTEM_SCOPE,))
    actions = [msgspec.json.decode(bytes(r[0]))["payload"]["action"] for r in entries]
    assert actions[:2] == ["space_registered", "default_space_set"]
    await wait_for(lambda: _has_action(env, "rebuild_completed"), timeout=30)


async def _has_action(env: Env, action: str) -> bool:
    rows = await sql_rows(env, "SELECT event FROM ledger WHERE scope_id = %s", (SYSTEM_SCOPE,))
    return any(msgspec.json.decode(bytes(r[0]))["payload"].get("action") == action for r in rows)


async def test_versions_get_one_vector_per_space_and_transitions_move_it_without_embedding(
        env: Env, indexed: Any, writer: CommandRequester) -> None:
    default = hashing_space(int(TEST_SPACE.split("-")[1])).embedding_space_id
    # The role registers its default space as it starts: wait for it, or it may come after the create and get
    # the object from its fill (which records no per-item entry) instead of from the live follower.
    await wait_for(lambda: _space_exists(env, default), timeout=30)
    await writer.command("register_embedding_space", {"scope_id": SYSTEM_SCOPE, "space": msgspec.to_builtins(SECOND),
                                                      "actor": SERVICE_ACTOR})
    await wait_for(lambda: _space_exists(env, SECOND.embedding_space_id), timeout=30)
    made = await indexed.create(SCOPE, "claim", {"statement": "the cat sat on the mat"}, ACTOR, PROVENANCE)
    oid = made["object_id"]
    await wait_for(lambda: indexed_through(env, made["ledger_sequence"]), timeout=30)
    for space_id in (default, SECOND.embedding_space_id):
        assert (await vectors(env, space_id))[oid][0] == made["version_id"]

    changed = await indexed.update(SCOPE, oid, made["version_id"], {"statement": "dogs bark at night"}, ACTOR,
                                   PROVENANCE)
    await wait_for(lambda: indexed_through(env, changed["ledger_sequence"]), timeout=30)
    before = await vectors(env, default)
    assert before[oid][0] == changed["version_id"]

    moved = await indexed.transition(SCOPE, oid, changed["version_id"], "validation", "corroborated", ACTOR,
                                     PROVENANCE)
    await wait_for(lambda: indexed_through(env, moved["ledger_sequence"]), timeout=30)
    after = await vectors(env, default)
    assert after[oid][0] == moved["version_id"] and after[oid][2] == before[oid][2]
    listed = Counter((tuple(item), p["embedding_space_id"]) for p in await generated(env) for item in p["items"])
    # Each embedded version is recorded once per space; the transition's version was moved, never embedded.
    for version in (made["version_id"], changed["version_id"]):
        for space_id in (default, SECOND.embedding_space_id):
            assert listed[((oid, version), space_id)] == 1
    assert not [k for k in listed if k[0] == (oid, moved["version_id"])]


async def _space_exists(env: Env, space_id: str) -> bool:
    async with await psycopg.AsyncConnection.connect(env.database_url, autocommit=True) as conn:
        return await find_space(conn, space_id) is not None


async def test_delete_and_redaction_leave_no_vector_of_the_object_in_any_space(env: Env, indexed: Any) -> None:
    gone = []
    for text in ("to be deleted", "to be redacted"):
        made = await indexed.create(SCOPE, "claim", {"statement": text}, ACTOR, PROVENANCE)
        await wait_for(lambda: indexed_through(env, made["ledger_sequence"]), timeout=30)
        assert await all_vector_rows(env, made["object_id"]) == 2
        gone.append(made)
    deleted = await indexed.delete(SCOPE, gone[0]["object_id"], gone[0]["version_id"], ACTOR, PROVENANCE)
    redacted = await indexed.transition(SCOPE, gone[1]["object_id"], gone[1]["version_id"], "availability",
                                        "redacted", ACTOR, PROVENANCE)
    await wait_for(lambda: indexed_through(env, max(deleted["ledger_sequence"], redacted["ledger_sequence"])),
                   timeout=30)
    for made in gone:
        assert await all_vector_rows(env, made["object_id"]) == 0


async def test_text_past_the_profile_is_cut_and_marked_truncated(env: Env, indexed: Any) -> None:
    made = await indexed.create(SCOPE, "claim", {"statement": "word " * 20_000}, ACTOR, PROVENANCE)
    textless = await indexed.create(SCOPE, "claim", {"confidence": 3}, ACTOR, PROVENANCE)
    await wait_for(lambda: indexed_through(env, textless["ledger_sequence"]), timeout=30)
    default = hashing_space(int(TEST_SPACE.split("-")[1])).embedding_space_id
    rows = await vectors(env, default)
    assert rows[made["object_id"]][1] is True
    assert textless["object_id"] not in rows


async def test_a_space_of_an_unknown_provider_is_left_unfilled_and_indexing_goes_on(
        env: Env, indexed: Any, writer: CommandRequester) -> None:
    other = msgspec.structs.replace(hashing_space(8), embedding_space_id="space:elsewhere:model:v1",
                                    provider="elsewhere")
    await writer.command("register_embedding_space", {"scope_id": SYSTEM_SCOPE, "space": msgspec.to_builtins(other),
                                                      "actor": SERVICE_ACTOR})
    made = await indexed.create(SCOPE, "claim", {"statement": "still indexed"}, ACTOR, PROVENANCE)
    await wait_for(lambda: indexed_through(env, made["ledger_sequence"]), timeout=30)
    assert made["object_id"] in await vectors(env, SECOND.embedding_space_id)
    assert await vectors(env, other.embedding_space_id) == {}
    async with await psycopg.AsyncConnection.connect(env.database_url, autocommit=True) as conn:
        space = await find_space(conn, other.embedding_space_id)
    assert space is not None and space.state == "filling"


async def test_the_outbox_sends_each_entry_once(env: Env, indexed: Any) -> None:
    await wait_for(lambda: indexed_through(env, 0), timeout=30)
    keys = await sql_rows(env, "SELECT l.event FROM ledger l WHERE event_type IN ('embedding_generated',"
                               " 'index_rebuilt') AND scope_id <> %s", (SYSTEM_SCOPE,))
    payloads = [msgspec.json.decode(bytes(r[0]))["payload"] for r in keys]
    assert payloads
    seen = Counter((p["embedding_space_id"], p["through_ledger_sequence"]) for p in payloads)
    assert max(seen.values()) == 1
