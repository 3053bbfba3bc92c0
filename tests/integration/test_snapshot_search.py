"""Search (semantic, lexical, hybrid) and related at a sealed snapshot, against the real service with the indexer.

Why: a snapshot's answers must be the same bytes after later updates, deletes, re-embeddings and a new default
space, semantic results included, which needs the vectors kept per version (embedding.store.keep_vectors) and
the space as it was when the snapshot was sealed; erasure still wins, and takes the kept vectors with it.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import msgspec
import psycopg
import pytest
from psycopg import sql

from embedding.embedders import hashing_space
from embedding.known import embedder_for
from embedding.store import find_space
from indexer.rebuild import fill_space
from indexer.role import set_default
from infra.requester import CommandRequester
from pamledger_client.protocol.subjects import query_subject
from pamledger_client.client import MemoryClient, PamspecError
from pamledger.supervisor import ROLES as ALL_ROLES
from schemas.common import SYSTEM_SCOPE
from tests.conftest import ACTOR, PROVENANCE, ROOT, TEST_SPACE, Env, serving, wait_for
from tests.integration.test_cli import error_of, run
from tests.integration.test_indexer import indexed_through

pytestmark = pytest.mark.profile("PAMSPEC-Evaluation")  # partially built, not claimed (docs/implementation-report.md)

SCOPE = "workspace:snapshot-search"
OTHER = "workspace:snapshot-search-other"
OLD = hashing_space(int(TEST_SPACE.split("-")[1]))
NEW = hashing_space(24)
# Every lifecycle and validation state (the default is the trusted target: active and corroborated only).
WIDE: dict[str, Any] = {"lifecycle_states": ["scratch", "candidate", "active", "superseded", "deprecated", "archived"],
                        "validation_states": ["unverified", "corroborated", "disputed", "rejected"]}
WRITERS = ("writer", "query", "projector", "gateway")  # no indexer: versions pile up for one batch


async def raw(client: MemoryClient, name: str, body: dict[str, Any]) -> bytes:
    reply = await client.nc.request(query_subject(client.prefix, name), msgspec.json.encode(body), timeout=10)
    return reply.data


def result(reply: bytes) -> Any:
    decoded = json.loads(reply)
    assert "result" in decoded, decoded
    return decoded["result"]


async def answers(client: MemoryClient, sid: str, objects: dict[str, str]) -> dict[str, bytes]:
    """Every answer at the snapshot the done-when compares: read of each object, a query, the three search
    modes by text, a semantic search by vector, and related from `cats` two hops out."""
    at = {"scope_id": SCOPE, "snapshot_id": sid}
    found = {f"read:{name}": await raw(client, "read", {**at, "object_id": oid}) for name, oid in objects.items()}
    found["query"] = await raw(client, "query", {**at, **WIDE})
    at = {**at, **WIDE}
    for mode in ("semantic", "lexical", "hybrid"):
        found[f"search:{mode}"] = await raw(client, "search", {**at, "text": "cats chase", "mode": mode})
    found["search:semantic:2"] = await raw(client, "search", {**at, "text": "cats chase", "mode": "semantic",
                                                              "limit": 2})  # the shortlist's answer, not the full
    found["search:vector"] = await raw(client, "search", {**at, "vector": [0.25] * OLD.dimensions, "mode": "semantic"})
    found["related"] = await raw(client, "related", {**at, "from_object_id": objects["cats"], "hops": 2})
    return found


async def head_sequence(env: Env) -> int:
    async with await psycopg.AsyncConnection.connect(env.database_url, autocommit=True) as conn:
        row = await (await conn.execute("SELECT max(ledger_sequence) FROM ledger")).fetchone()
        return int(row[0]) if row and row[0] else 0


async def kept_rows(env: Env, object_id: str) -> int:
    async with await psycopg.AsyncConnection.connect(env.database_url, autocommit=True) as conn:
        space = await find_space(conn, OLD.embedding_space_id)
        assert space is not None
        cur = await conn.execute(sql.SQL("SELECT count(*) FROM {} WHERE object_id = %s").format(space.kept_table),
                                 (object_id,))
        return int((await cur.fetchone() or (0,))[0])


async def claim(client: MemoryClient, text: str) -> dict[str, Any]:
    return await client.create(SCOPE, "claim", {"statement": text}, ACTOR, PROVENANCE)


@pytest.fixture(scope="module")
async def world(env: Env) -> dict[str, Any]:
    """The default space registered first (indexer on), then objects, updates and relationships written with
    the indexer off, and a snapshot sealed at a version its own batch supersedes."""
    async with serving(env, ALL_ROLES, roles=ALL_ROLES) as client:
        await client.create_scope(SCOPE)
        await client.create_scope(OTHER)
        await wait_for(lambda: indexed_through(env, 1), timeout=30)
    async with serving(env, WRITERS, roles=WRITERS) as client:
        made = {name: await claim(client, text) for name, text in (
            ("cats", "cats chase mice"), ("dogs", "dogs chase cats"), ("rain", "rain falls on cats"))}
        dogs2 = await client.update(SCOPE, made["dogs"]["object_id"], made["dogs"]["version_id"],
                                    {"statement": "dogs chase cats twice"}, ACTOR, PROVENANCE)
        middle = await client.snapshot_create(SCOPE, ACTOR, at=dogs2["ledger_sequence"])
        await client.update(SCOPE, made["dogs"]["object_id"], dogs2["version_id"], {"statement": "dogs nap"},
                            ACTOR, PROVENANCE)
        ids = {name: m["object_id"] for name, m in made.items()}
        for source, target in (("dogs", "cats"), ("rain", "cats"), ("rain", "dogs")):
            await client.relate(SCOPE, ids[source], ids[target], "supports", ACTOR, PROVENANCE)
        outsider = await claim(client, "cats outside the snapshot")
    return {"ids": ids, "dogs2": dogs2, "middle": middle["snapshot"]["snapshot_id"], "outsider": outsider}


@pytest.fixture(scope="module")
async def client(env: Env, world: dict[str, Any]) -> AsyncIterator[MemoryClient]:
    async with serving(env, ALL_ROLES, roles=ALL_ROLES) as c:
        await wait_for(lambda: _indexed_to_head(env), timeout=60)
        yield c


async def _indexed_to_head(env: Env) -> bool:
    return await indexed_through(env, await head_sequence(env))


async def test_every_answer_at_a_snapshot_is_the_same_bytes_after_writes_deletes_reembedding_and_a_new_default(
        env: Env, client: MemoryClient, world: dict[str, Any]) -> None:
    ids = world["ids"]
    sealed = await client.snapshot_create(SCOPE, ACTOR, object_ids=list(ids.values()))
    sid = sealed["snapshot"]["snapshot_id"]
    before = {**await answers(client, sid, ids),
              **{f"middle:{k}": v for k, v in (await answers(client, world["middle"], ids)).items()}}
    semantic = result(before["search:semantic"])
    assert {i["object_id"] for i in semantic["items"]} == set(ids.values())
    assert semantic["embedding_space_id"] == OLD.embedding_space_id and semantic["as_of_sequence"] == \
        sealed["snapshot"]["ledger_sequence_high_watermark"]
    assert semantic["index"]["method"] == "exact" and semantic["snapshot"]["erased_since_seal"] == 0
    assert [i["object_id"] for i in result(before["search:lexical"])["items"]] != []
    assert result(before["search:semantic:2"])["items"] == semantic["items"][:2]
    middle = {i["object_id"]: i for i in result(before["middle:search:semantic"])["items"]}
    dogs2 = world["dogs2"]
    assert middle[ids["dogs"]]["version_id"] == dogs2["version_id"]  # a version its own batch superseded
    assert middle[ids["dogs"]]["vector_version_id"] == dogs2["version_id"]
    related = result(before["related"])
    assert len(related["edges"]) == 3 and related["snapshot"]["snapshot_id"] == sid
    assert result(before["middle:related"])["edges"] == []  # no relationship yet at that watermark

    await _change_everything(env, client, world)

    after = {**await answers(client, sid, ids),
             **{f"middle:{k}": v for k, v in (await answers(client, world["middle"], ids)).items()}}
    assert {k for k in before if before[k] != after[k]} == set()
    live = await client.search(SCOPE, text="cats chase", mode="semantic", filter=WIDE)
    assert live["embedding_space_id"] == NEW.embedding_space_id  # the live search did move


async def _change_everything(env: Env, client: MemoryClient, world: dict[str, Any]) -> None:
    """Update, create, delete (objects outside the snapshot), relate, re-embed the old space by its rebuild
    path over overwritten live vectors, and register and switch to a new default space."""
    ids = world["ids"]
    for name in ("cats", "dogs"):
        current = await client.read(SCOPE, ids[name])
        await client.update(SCOPE, ids[name], current["version_id"], {"statement": f"{name} changed"}, ACTOR,
                            PROVENANCE)
    late = await claim(client, "cats made after the seal")
    await client.delete(SCOPE, late["object_id"], late["version_id"], ACTOR, PROVENANCE)
    outsider = world["outsider"]
    await client.delete(SCOPE, outsider["object_id"], outsider["version_id"], ACTOR, PROVENANCE)
    await client.relate(SCOPE, ids["cats"], ids["rain"], "contradicts", ACTOR, PROVENANCE)
    await wait_for(lambda: _indexed_to_head(env), timeout=60)
    async with await psycopg.AsyncConnection.connect(env.database_url, autocommit=True) as conn:
        space = await find_space(conn, OLD.embedding_space_id)
        assert space is not None
        await conn.execute(sql.SQL("UPDATE {} SET embedding = %s::vector WHERE scope_id = %s").format(space.table),
                           ("[" + ",".join(["1"] * OLD.dimensions) + "]", SCOPE))
        await conn.execute(sql.SQL("DELETE FROM {} WHERE scope_id = %s AND object_id = %s").format(space.table),
                           (SCOPE, ids["rain"]))
        embedder = embedder_for(space.descriptor)
        assert embedder is not None
        report = await fill_space(conn, space, embedder)
        assert report.embedded >= 1  # rain, embedded again
    requester = CommandRequester(client.nc, env.settings.subject_prefix)
    await requester.command("register_embedding_space", {"scope_id": SYSTEM_SCOPE,
                                                         "space": msgspec.to_builtins(NEW), "actor": ACTOR})
    await wait_for(lambda: _ready(env, NEW.embedding_space_id), timeout=60)
    await set_default(requester, NEW.embedding_space_id, "default-space:snapshot-search")
    await wait_for(lambda: _is_default(env, NEW.embedding_space_id), timeout=30)
    await wait_for(lambda: _indexed_to_head(env), timeout=60)


async def _ready(env: Env, space_id: str) -> bool:
    async with await psycopg.AsyncConnection.connect(env.database_url, autocommit=True) as conn:
        space = await find_space(conn, space_id)
        return space is not None and space.state == "ready"


async def _is_default(env: Env, space_id: str) -> bool:
    async with await psycopg.AsyncConnection.connect(env.database_url, autocommit=True) as conn:
        space = await find_space(conn, None)
        return space is not None and space.embedding_space_id == space_id


async def test_erasure_after_the_seal_removes_the_hit_counts_it_and_deletes_its_kept_vectors(
        env: Env, client: MemoryClient) -> None:
    victim = await claim(client, "a secret about cats to forget")
    keeper = await claim(client, "a fact about cats to keep")
    await wait_for(lambda: _indexed_to_head(env), timeout=60)
    sealed = await client.snapshot_create(SCOPE, ACTOR, object_ids=[victim["object_id"], keeper["object_id"]],
                                          included_embedding_space_ids=[OLD.embedding_space_id])
    sid = sealed["snapshot"]["snapshot_id"]
    found = await client.search(SCOPE, text="cats", mode="hybrid", snapshot_id=sid, filter=WIDE)
    assert {i["object_id"] for i in found["items"]} == {victim["object_id"], keeper["object_id"]}
    assert await kept_rows(env, victim["object_id"]) == 1
    await client.delete(SCOPE, victim["object_id"], victim["version_id"], ACTOR, PROVENANCE)
    await wait_for(lambda: _indexed_to_head(env), timeout=60)
    assert await kept_rows(env, victim["object_id"]) == 0 and await kept_rows(env, keeper["object_id"]) == 1
    for mode in ("semantic", "lexical", "hybrid"):
        reply = await raw(client, "search", {"scope_id": SCOPE, "snapshot_id": sid, "text": "cats",
                                             "mode": mode, **WIDE})
        assert b"a secret about cats" not in reply
        after = result(reply)
        assert [i["object_id"] for i in after["items"]] == [keeper["object_id"]], (mode, reply)
        assert after["snapshot"]["erased_since_seal"] == 1


async def test_an_unknown_or_another_scopes_snapshot_is_not_found_and_an_unnamed_space_is_refused(
        client: MemoryClient, world: dict[str, Any]) -> None:
    ids = world["ids"]
    other = await client.snapshot_create(OTHER, ACTOR)
    named = await client.snapshot_create(SCOPE, ACTOR, included_embedding_space_ids=[OLD.embedding_space_id])
    for sid in ("snap:nobody", other["snapshot"]["snapshot_id"]):
        for name, body in (("search", {"text": "cats"}), ("related", {"from_object_id": ids["cats"]})):
            with pytest.raises(PamspecError) as caught:
                await client.query_request(name, {"scope_id": SCOPE, "snapshot_id": sid, **body})
            assert caught.value.code == "snapshot_not_found", (name, sid)
    with pytest.raises(PamspecError) as caught:
        await client.search(SCOPE, text="cats", space=NEW.embedding_space_id,
                            snapshot_id=named["snapshot"]["snapshot_id"])
    assert caught.value.code == "invalid_request"
    for name, body in (("search", {"text": "cats"}), ("related", {"from_object_id": ids["cats"]})):
        with pytest.raises(PamspecError) as caught:
            await client.query_request(name, {"scope_id": SCOPE, "snapshot_id": named["snapshot"]["snapshot_id"],
                                              "min_sequence": 1, **body})
        assert caught.value.code == "invalid_request"
    with pytest.raises(PamspecError) as caught:  # related from an object the snapshot does not hold
        await client.related(SCOPE, world["outsider"]["object_id"], snapshot_id=world["middle"])
    assert caught.value.code == "object_not_found"


async def test_the_migration_keeps_what_each_spaces_live_table_holds(env: Env, client: MemoryClient) -> None:
    """infra/sql/020_kept_vectors.sql, run again over spaces that exist (it is idempotent): every live vector
    with a content digest is kept, and a kept vector is never replaced."""
    migration = next(p for p in (ROOT / "infra" / "sql").iterdir() if p.name.startswith("020_"))
    async with await psycopg.AsyncConnection.connect(env.database_url, autocommit=True) as conn:
        space = await find_space(conn, NEW.embedding_space_id)
        assert space is not None
        await conn.execute(sql.SQL("DELETE FROM {}").format(space.kept_table))
        await conn.execute(migration.read_text())  # type: ignore[arg-type]
        missing = await (await conn.execute(sql.SQL(
            "SELECT count(*) FROM {} t WHERE NOT EXISTS (SELECT 1 FROM {} k WHERE k.scope_id = t.scope_id"
            " AND k.object_id = t.object_id AND k.content_digest = t.content_digest AND k.embedding = t.embedding)"
        ).format(space.table, space.kept_table))).fetchone()
        kept = await (await conn.execute(sql.SQL("SELECT count(*) FROM {}").format(space.kept_table))).fetchone()
    assert missing == (0,) and kept is not None and kept[0] > 0


async def test_the_cli_searches_and_walks_relationships_at_a_snapshot(env: Env, client: MemoryClient,
                                                                      world: dict[str, Any], tmp_path: Path) -> None:
    ids, sid = world["ids"], world["middle"]
    wide = ("--validation", "unverified", "--lifecycle", "candidate", "--lifecycle", "active")
    code, found, err = await run(env, tmp_path, "search", SCOPE, "dogs chase", "--mode", "semantic", "--snapshot",
                                 sid, *wide)
    assert code == 0, err
    assert found == result(await raw(client, "search", {"scope_id": SCOPE, "snapshot_id": sid, "text": "dogs chase",
                                                        "mode": "semantic", "limit": 10,
                                                        "validation_states": ["unverified"],
                                                        "lifecycle_states": ["candidate", "active"]}))
    assert ids["dogs"] in [i["object_id"] for i in found["items"]] and found["snapshot"]["snapshot_id"] == sid
    code, walked, err = await run(env, tmp_path, "related", SCOPE, ids["cats"], "--snapshot", sid)
    assert code == 0 and walked["edges"] == [] and walked["as_of_sequence"] == found["as_of_sequence"], err
    code, _, err = await run(env, tmp_path, "search", SCOPE, "cats", "--snapshot", "snap:cli:none")
    assert code != 0 and error_of(err)["code"] == "snapshot_not_found"


async def test_a_snapshot_ranks_as_live_search_did_when_older_versions_crowd_the_nearest_vectors(
        env: Env, client: MemoryClient) -> None:
    """Sixty objects whose first version is the nearest text and whose current one is far: the nearest kept
    vectors are all older versions', so the snapshot's ranking must look past them (the shortlist's bound) and
    answer what the live search (one current vector per object, exact at this size) answers at the same state."""
    scope = "workspace:snapshot-search-crowded"
    await client.create_scope(scope)
    for i in range(60):
        made = await client.create(scope, "claim", {"statement": "alpha beta gamma"}, ACTOR, PROVENANCE)
        await client.update(scope, made["object_id"], made["version_id"], {"statement": f"zeta omega {i}"}, ACTOR,
                            PROVENANCE)
    await client.create(scope, "claim", {"statement": "alpha beta gamma delta"}, ACTOR, PROVENANCE)
    await wait_for(lambda: _indexed_to_head(env), timeout=60)
    sealed = await client.snapshot_create(scope, ACTOR)
    for limit in (2, 5):
        body = {"scope_id": scope, "text": "alpha beta gamma", "mode": "semantic", "limit": limit, **WIDE}
        live = result(await raw(client, "search", body))
        pinned = result(await raw(client, "search", {**body, "snapshot_id": sealed["snapshot"]["snapshot_id"]}))
        ranked = [[(i["object_id"], i["version_id"], i["semantic_score"]) for i in r["items"]] for r in (live, pinned)]
        assert ranked[0] == ranked[1] and len(ranked[0]) == limit
