"""`export --vectors` and what an import does with the vectors (PAMSPEC 7.8: exported vectors carry their
space descriptor): one vector line per current embedded version, with its space id and descriptor digest;
no vector of an erased, suppressed or hidden version (a vector leaks its content); an edited vector line is
refused naming the line; an import into a service with the same space hands the vectors to its indexer,
which stores them as they were instead of embedding again, and into a service with another space they are
left out and its indexer embeds the imported content.

The source and the targets run every role, the indexer included (its default space is TEST_SPACE).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg import sql

from embedding.embedders import hashing_space
from embedding.store import INDEX_CHECKPOINT, SpaceRow, find_space, list_spaces
from infra.projections import checkpoint
from infra.settings import IndexerSettings
from pamledger.bundle import check_bundle, export_bundle, import_bundle
from pamledger_client.client import MemoryClient, PamspecError
from pamledger.supervisor import ROLES as ALL_ROLES
from schemas.canonical import canonical_bytes
from schemas.embedding import space_digest
from tests.conftest import ACTOR, Env, fresh_database, fresh_settings, run_cli, serving, wait_for

SCOPE = "workspace:vectors-src"
PROVENANCE = {"provenance_id": "prov:vectors", "actor": ACTOR, "activity": "vectors-test"}
pytestmark = pytest.mark.profile("PAMSPEC-Core")  # docs/implementation-report.md
ERASED = f"erased{uuid.uuid4().hex[:10]}"
HIDDEN = f"hidden{uuid.uuid4().hex[:10]}"
SUPPRESSED = f"suppressed{uuid.uuid4().hex[:10]}"
SPACE = hashing_space(16)  # tests.conftest.TEST_SPACE
EMBEDDED = {"mem:vec:kept", "mem:vec:plain", "mem:vec:partial"}  # the objects whose current content is shown


@dataclass
class World:
    source: Env
    src: MemoryClient
    bundle: Path
    export: dict[str, Any]
    tmp: Path


async def _write(client: MemoryClient) -> None:
    await client.create_scope(SCOPE)
    kept = await client.create(SCOPE, "claim", {"statement": "kept alpha"}, ACTOR, PROVENANCE, object_id="mem:vec:kept")
    kept = await client.update(SCOPE, kept["object_id"], kept["version_id"], {"statement": "kept beta gamma"}, ACTOR,
                               PROVENANCE)
    await client.transition(SCOPE, kept["object_id"], kept["version_id"], "validation", "corroborated", ACTOR,
                            PROVENANCE)  # a version of the same content: its vector moves to it
    plain = await client.create(SCOPE, "observation", {"statement": "plain delta"}, ACTOR, PROVENANCE,
                                object_id="mem:vec:plain")
    gone = await client.create(SCOPE, "observation", {"statement": ERASED}, ACTOR, PROVENANCE,
                               object_id="mem:vec:deleted")
    await client.delete(SCOPE, gone["object_id"], gone["version_id"], ACTOR, PROVENANCE)
    redacted = await client.create(SCOPE, "claim", {"statement": ERASED + " again"}, ACTOR, PROVENANCE,
                                   object_id="mem:vec:redacted")
    await client.redact(SCOPE, redacted["object_id"], redacted["version_id"], ACTOR, PROVENANCE, "test policy")
    suppressed = await client.create(SCOPE, "claim", {"statement": SUPPRESSED}, ACTOR, PROVENANCE,
                                     object_id="mem:vec:suppressed")
    await client.redact(SCOPE, suppressed["object_id"], suppressed["version_id"], ACTOR, PROVENANCE,
                        "test policy", erase=False)
    partial = await client.create(SCOPE, "claim", {"statement": "partly", "detail": {"secret": HIDDEN}}, ACTOR,
                                  PROVENANCE, object_id="mem:vec:partial")
    await client.redact(SCOPE, partial["object_id"], partial["version_id"], ACTOR, PROVENANCE, "test policy",
                        pointers=["/detail/secret"])
    await client.relate(SCOPE, "mem:vec:kept", plain["object_id"], "supports", ACTOR, PROVENANCE,
                        relationship_id="rel:vec:1")


async def _caught_up(env: Env) -> bool:
    """The indexer has applied the whole ledger, its own outbox entries included, and filled its space."""
    async with await psycopg.AsyncConnection.connect(env.database_url, autocommit=True) as conn:
        row = await (await conn.execute("SELECT coalesce(max(ledger_sequence), 0) FROM ledger")).fetchone()
        head = row[0] if row else 0
        outbox = await (await conn.execute("SELECT count(*) FROM index_outbox")).fetchone()
        default = await find_space(conn, None)
        return bool(outbox and outbox[0] == 0 and default is not None and default.state == "ready"
                    and await checkpoint(conn, INDEX_CHECKPOINT) >= head)


async def settle(env: Env) -> None:
    async def twice() -> bool:  # the outbox's entries move the head once more: caught up on both looks
        return await _caught_up(env) and await _caught_up(env)
    await wait_for(twice, timeout=90, interval=0.2)


async def stored_vectors(env: Env, scope_id: str, form: str = "embedding::text") -> dict[tuple[str, str, str], Any]:
    """(space id, object_id, version_id) -> the stored vector (its text form, or `form`), of every space's table."""
    out: dict[tuple[str, str, str], Any] = {}
    async with await psycopg.AsyncConnection.connect(env.database_url, autocommit=True) as conn:
        for space in await list_spaces(conn):
            cur = await conn.execute(sql.SQL("SELECT object_id, version_id, {} FROM {} WHERE scope_id = %s").format(
                sql.SQL(form), space.table), (scope_id,))
            for object_id, version_id, text in await cur.fetchall():
                out[(space.embedding_space_id, object_id, version_id)] = text
    return out


async def default_space(env: Env) -> SpaceRow:
    async with await psycopg.AsyncConnection.connect(env.database_url, autocommit=True) as conn:
        space = await find_space(conn, None)
    assert space is not None
    return space


@contextlib.asynccontextmanager
async def _service(source: Env, label: str, model: str | None = None) -> AsyncIterator[tuple[Env, MemoryClient]]:
    settings = fresh_settings(label, **({"indexer": IndexerSettings(default_space=model)} if model else {}))
    target = Env(source.servers, fresh_database(source.servers, label), settings)
    async with serving(target, ALL_ROLES, roles=ALL_ROLES) as client:
        yield target, client


@pytest.fixture(scope="module")
async def world(env: Env, tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[World]:
    tmp = tmp_path_factory.mktemp("vectors")
    async with serving(env, ALL_ROLES, roles=ALL_ROLES) as src:
        await _write(src)
        await settle(env)
        bundle = tmp / "vectors.pamb"
        with bundle.open("wb") as out:
            summary = await export_bundle(src, SCOPE, out, vectors=True)
        yield World(env, src, bundle, summary, tmp)


def lines(path: Path) -> list[dict[str, Any]]:
    return [json.loads(raw) for raw in path.read_bytes().splitlines()]


def vector_lines(path: Path) -> list[dict[str, Any]]:
    return [line for line in lines(path) if line["kind"] == "vector"]


def as_text(values: list[float]) -> str:
    """A bundle's vector in pgvector's text form (what the tables answer to embedding::text)."""
    return "[" + ",".join(json.dumps(v) for v in values) + "]"


async def test_each_current_embedded_version_has_one_vector_line_with_its_space_digest(world: World) -> None:
    all_lines = lines(world.bundle)
    header, trailer = all_lines[0], all_lines[-1]
    assert header["vectors"] is True
    assert [(s["embedding_space"]["embedding_space_id"], s["space_digest"]) for s in header["embedding_spaces"]] \
        == [(SPACE.embedding_space_id, space_digest(SPACE))]
    vectors = vector_lines(world.bundle)
    stored = await stored_vectors(world.source, SCOPE)
    assert {key[1] for key in stored} == EMBEDDED  # the control: the indexer made exactly these
    assert {(v["embedding_space_id"], v["object_id"], v["version_id"]): as_text(v["vector"]) for v in vectors} \
        == stored  # one line per stored vector, its values as stored, byte for byte in text form
    assert {v["space_digest"] for v in vectors} == {space_digest(SPACE)}
    assert all(len(v["vector"]) == SPACE.dimensions for v in vectors)
    assert trailer["counts"]["vectors"] == len(vectors) == world.export["counts"]["vectors"] == 3
    for index, line in enumerate(all_lines):
        if line["kind"] == "vector":  # right after the event of the version it names
            event = all_lines[index - 1]
            assert event["kind"] == "event" and event["event"]["version_id"] == line["version_id"]
            assert event["event"]["payload"]["content_digest"] == line["content_digest"]
    assert check_bundle(world.bundle).counts["vectors"] == 3


async def test_erased_suppressed_and_hidden_versions_have_no_vector(world: World) -> None:
    data = world.bundle.read_bytes()
    assert ERASED.encode() not in data and HIDDEN.encode() not in data and SUPPRESSED.encode() not in data
    named = {v["object_id"]: v["version_id"] for v in vector_lines(world.bundle)}
    history = await world.src.history(SCOPE, "mem:vec:partial")
    assert named["mem:vec:partial"] == history["versions"][-1]["version_id"]  # the redacted one's, not the first's


async def test_a_vector_left_behind_of_hidden_content_is_not_exported(world: World) -> None:
    """Even a vector still in a table (an indexer behind an erasure) goes out only with its version's content
    shown: one planted for the suppressed object's first version, whose content its latest version hides."""
    history = await world.src.history(SCOPE, "mem:vec:suppressed")
    first = history["versions"][0]
    space = await default_space(world.source)
    async with await psycopg.AsyncConnection.connect(world.source.database_url, autocommit=True) as conn:
        await conn.execute(sql.SQL(
            "INSERT INTO {} (scope_id, object_id, version_id, version_sequence, ledger_sequence, truncated,"
            " content_digest, embedding) VALUES (%s, %s, %s, 1, 1, false, NULL, %s::vector)").format(space.table),
            (SCOPE, "mem:vec:suppressed", first["version_id"], as_text([0.25] * SPACE.dimensions)))
        try:
            planted = world.tmp / "planted.pamb"
            with planted.open("wb") as out:
                await export_bundle(world.src, SCOPE, out, vectors=True)
        finally:
            await conn.execute(sql.SQL("DELETE FROM {} WHERE scope_id = %s AND object_id = %s").format(space.table),
                               (SCOPE, "mem:vec:suppressed"))
    assert "mem:vec:suppressed" not in {v["object_id"] for v in vector_lines(planted)}
    assert len(vector_lines(planted)) == 3


async def test_an_export_without_vectors_carries_none(world: World) -> None:
    plain = world.tmp / "plain.pamb"
    with plain.open("wb") as out:
        summary = await export_bundle(world.src, SCOPE, out)
    assert summary["counts"]["vectors"] == 0 and vector_lines(plain) == []
    assert "vectors" not in lines(plain)[0]
    without = [line for line in lines(world.bundle)[1:-1] if line["kind"] != "vector"]
    assert without == lines(plain)[1:-1]  # the same entries, vectors aside


def _forged(world: World, name: str, change: Callable[[list[bytes]], list[bytes]]) -> Path:
    """The bundle changed, with its trailer recomputed: only the line checks can refuse it."""
    raw = change(world.bundle.read_bytes().splitlines(keepends=True))
    body = b"".join(raw[:-1])
    trailer = json.loads(raw[-1])
    kinds = [json.loads(line)["kind"] for line in raw[1:-1]]
    trailer["counts"]["vectors"] = kinds.count("vector")
    trailer["counts"]["lines"] = len(raw) - 1
    trailer["sha256"] = "sha256:" + hashlib.sha256(body).hexdigest()
    path = world.tmp / name
    path.write_bytes(body + canonical_bytes(trailer) + b"\n")
    return path


def _refusal(path: Path) -> dict[str, Any]:
    with pytest.raises(PamspecError) as refused:
        check_bundle(path)
    assert refused.value.code == "invalid_request"
    return refused.value.details


def _first_vector(raw: list[bytes]) -> int:
    return next(i for i, line in enumerate(raw) if b'"kind":"vector"' in line)


def _edit_vector(change: Callable[[dict[str, Any]], None]) -> Callable[[list[bytes]], list[bytes]]:
    def edit(raw: list[bytes]) -> list[bytes]:
        index = _first_vector(raw)
        line = json.loads(raw[index])
        change(line)
        return [*raw[:index], canonical_bytes(line) + b"\n", *raw[index + 1:]]
    return edit


def test_an_edited_vector_line_is_refused_naming_the_line(world: World) -> None:
    raw = world.bundle.read_bytes().splitlines(keepends=True)
    number = _first_vector(raw) + 1
    plain = world.tmp / "edited-value.pamb"
    index = number - 1
    edited = json.loads(raw[index])
    edited["vector"][0] = 0.5 if edited["vector"][0] != 0.5 else 0.25
    plain.write_bytes(b"".join([*raw[:index], canonical_bytes(edited) + b"\n", *raw[index + 1:]]))
    assert "sha256" in _refusal(plain)["reason"]  # without a recomputed trailer: the digest
    cases: list[tuple[str, Callable[[dict[str, Any]], None], str]] = [
        ("short", lambda v: v["vector"].pop(), "dimensions"),
        ("space", lambda v: v.update(space_digest="sha256:" + "0" * 64), "not one the header names"),
        ("unknown-space", lambda v: v.update(embedding_space_id="space:other"), "not one the header names"),
        ("huge", lambda v: v["vector"].__setitem__(0, 1e39), "not a finite float4"),
        ("version", lambda v: v.update(version_id="ver:someone-else"), "follows the event of the version"),
        ("digest", lambda v: v.update(content_digest="sha256:" + "1" * 64), "follows the event of the version"),
    ]
    for name, change, reason in cases:
        details = _refusal(_forged(world, f"{name}.pamb", _edit_vector(change)))
        assert details["line"] == number and reason in details["reason"], (name, details)
    twice = _refusal(_forged(world, "twice.pamb", lambda raw: [*raw[:number], raw[number - 1], *raw[number:]]))
    assert twice["line"] == number + 1 and "second vector" in twice["reason"]
    moved = _refusal(_forged(world, "moved.pamb", lambda raw: [*raw[:number - 2], raw[number - 1], raw[number - 2],
                                                               *raw[number:]]))
    assert moved["line"] == number - 1 and "follows the event" in moved["reason"]
    unsaid = _refusal(_forged(world, "unsaid.pamb", lambda raw: [
        raw[0].replace(b'"vectors":true', b'"vectors":false'), *raw[1:]]))
    assert unsaid["line"] == number and "carries none" in unsaid["reason"]


async def test_the_cli_exports_vectors(world: World) -> None:
    out = world.tmp / "cli.pamb"
    exported = await asyncio.to_thread(run_cli, world.source, "export", SCOPE, "--vectors", "--out", str(out))
    assert exported.returncode == 0, exported.stderr
    assert json.loads(exported.stdout)["counts"]["vectors"] == 3
    assert [{k: v for k, v in line.items()} for line in vector_lines(out)] == vector_lines(world.bundle)


async def indexer_records(client: MemoryClient) -> tuple[set[tuple[str, str]], set[tuple[str, str]]]:
    """(embedded, reused): the (object_id, version_id) the target's indexer recorded in the scope."""
    events = await client.events(SCOPE, limit=1000)
    payloads = [e["event"]["payload"] for e in events["events"] if e["event"]["event_type"] == "embedding_generated"]
    embedded = {(o, v) for p in payloads for o, v in p["items"]}
    return embedded, {(o, v) for p in payloads for o, v in p.get("reused", [])}


async def handoff_rows(env: Env) -> int:
    async with await psycopg.AsyncConnection.connect(env.database_url, autocommit=True) as conn:
        row = await (await conn.execute("SELECT count(*) FROM vector_handoff")).fetchone()
    return int(row[0]) if row else -1


async def test_an_import_into_the_same_space_stores_the_bundles_vectors_without_embedding(world: World) -> None:
    async with _service(world.source, "vectors_same") as (target, client):
        await settle(target)  # its space is registered (the same as the source's) before the import
        result = await import_bundle(client, world.bundle, ACTOR)
        assert result["result"] == "imported"
        assert result["vectors"] == {"in_bundle": 3, "handed_over": 3, "left_to_indexer": 0}
        await settle(target)
        stored = await stored_vectors(target, SCOPE)
        assert stored == await stored_vectors(world.source, SCOPE)  # the same versions, the same float4s
        binary = "vector_send(embedding)"  # pgvector's binary form: byte for byte
        assert await stored_vectors(target, SCOPE, binary) == await stored_vectors(world.source, SCOPE, binary)
        embedded, reused = await indexer_records(client)
        assert {name for name, _ in reused} == EMBEDDED  # stored as handed over
        assert not {(key[1], key[2]) for key in stored} & embedded  # no current vector was embedded here
        assert await handoff_rows(target) == 0  # the indexer forgot them once it was past their versions
        again = await import_bundle(client, world.bundle, ACTOR)
        assert again["result"] == "already_imported" and again["vectors"]["handed_over"] == 0


async def test_an_import_into_another_space_leaves_the_vectors_and_the_indexer_embeds(world: World) -> None:
    async with _service(world.source, "vectors_other", model="hashing-8") as (target, client):
        await settle(target)
        # A space under the bundle's space id but with another descriptor: not the same space either.
        forged = {**json.loads(canonical_bytes(SPACE)), "model_revision": "another revision"}
        await client.command("register_embedding_space", {"scope_id": "system:pamledger", "space": forged,
                                                          "actor": ACTOR})
        result = await import_bundle(client, world.bundle, ACTOR)
        assert result["vectors"] == {"in_bundle": 3, "handed_over": 0, "left_to_indexer": 3}
        await settle(target)
        stored = await stored_vectors(target, SCOPE)
        assert {key[1] for key in stored} == EMBEDDED
        assert {key[0] for key in stored} == {hashing_space(8).embedding_space_id}
        embedded, reused = await indexer_records(client)
        assert reused == set() and {(key[1], key[2]) for key in stored} <= embedded
        assert await handoff_rows(target) == 0


async def test_an_object_erased_before_the_indexer_took_its_vector_leaves_none_behind(world: World) -> None:
    """The handed-over vectors wait for the indexer; a deletion in between reaches them as it reaches the
    vector tables: the indexer drops them with the object's erasure."""
    target = Env(world.source.servers, fresh_database(world.source.servers, "vectors_erase"),
                 fresh_settings("vectors_erase"))
    async with serving(target, ALL_ROLES, roles=ALL_ROLES):
        await settle(target)  # its space registered and ready
    async with serving(target) as client:  # the indexer stopped
        result = await import_bundle(client, world.bundle, ACTOR)
        assert result["vectors"]["handed_over"] == 3 and await handoff_rows(target) == 3
        plain = await client.read(SCOPE, "mem:vec:plain")
        await client.delete(SCOPE, "mem:vec:plain", plain["version_id"], ACTOR, PROVENANCE)
    async with serving(target, ALL_ROLES, roles=ALL_ROLES) as client:
        await settle(target)
        assert {key[1] for key in await stored_vectors(target, SCOPE)} == EMBEDDED - {"mem:vec:plain"}
        assert await handoff_rows(target) == 0
        _, reused = await indexer_records(client)
        assert {name for name, _ in reused} == EMBEDDED - {"mem:vec:plain"}
