"""The erasure canary: a unique word written into content, erased, then looked for in every store.

Why: invariant 10 (docs/architecture.md) says erased content is gone from every store that held it. A store
added later (a table, a cache column, a replay table, a stream) is exactly where it would survive unnoticed,
so the database is not searched table by table from a list but by enumerating every column of every table of
every schema that can hold text (text, varchar, bytea, json, jsonb, tsvector, arrays), plus the JetStream
replica's every message, the embedding tables and the answers of read, history, query and search.

Each shape of content gets its own canary word, erased its own way (delete; full redaction with cmd.redact;
partial redaction with JSON Pointers; availability transition to redacted; a relationship deleted), so a
failure names the path that leaked. Controls: before the erasure each canary IS found in the content store,
the full-text index, the vector tables and the answers; after it, the metadata canary (provenance.activity,
which a redaction cannot reach: docs/security.md "What a redaction can reach") is still found in the ledger,
the stored versions, the projection, a kept replay table and the stream, so the very same scans are shown to
find what is there. A suppression (erase=false) is not an erasure: hidden from reads, full text and vectors,
kept in the content store (documented).
"""

from __future__ import annotations

import json
import uuid
from collections import defaultdict
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import msgspec
import psycopg
import pytest
from psycopg import sql

from embedding.known import embedder_for
from embedding.store import INDEX_CHECKPOINT, find_space, list_spaces
from indexer.texts import text_of
from infra.projections import checkpoint
from pamledger_client.client import MemoryClient, PamspecError
from pamledger.runtime import connect_nats
from pamledger.supervisor import ROLES as ALL_ROLES
from projector.replay import ReplayOptions, replay
from tests.conftest import ACTOR, Env, run_cli, serving, wait_for

pytestmark = pytest.mark.profile("PAMSPEC-Core", "PAMSPEC-Ledger")  # docs/implementation-report.md

SCOPE = "workspace:canary"
ALL_AVAILABILITY = ["available", "partially_redacted", "redacted", "deleted"]
EVERYTHING: dict[str, Any] = {"availability_states": ALL_AVAILABILITY,  # Query and search show available, corroborated by default
              "validation_states": ["unverified", "corroborated", "disputed", "rejected"],
              "lifecycle_states": ["scratch", "candidate", "active", "superseded", "deprecated", "archived"]}
# How each shape's content is erased (or, for "suppressed", hidden without erasure).
SHAPES = ("deleted", "partial", "working_memory", "relationship", "transitioned", "suppressed", "partsupp")
ERASED = ("deleted", "working_memory", "relationship", "transitioned")
EMBEDDED = ("deleted", "partial", "working_memory", "transitioned", "suppressed", "partsupp")  # not relationships
SUPPRESSED = ("suppressed", "partsupp")  # redact with erase=false: full, and with pointers
STATISTICS = "pg_catalog.pg_statistic"
# Column types that can hold a string (an array of them is searched through its text form too).
TEXTUAL = ("text", "character varying", "character", "name", "bytea", "json", "jsonb", "tsvector", "xml")


def word(tag: str) -> str:
    """A word no text has: letters and digits only, so tsvector keeps it whole and unstemmed."""
    return f"zq{tag}{uuid.uuid4().hex}x"


@dataclass
class World:
    canary: dict[str, str]  # shape -> the word in its content
    kept: str  # a word of the partially redacted object's kept part
    meta: str  # a word in provenance.activity of every write: metadata a redaction cannot reach
    made: dict[str, dict[str, Any]] = field(default_factory=dict)  # shape -> the write's reply
    erasure: dict[str, dict[str, Any]] = field(default_factory=dict)  # shape -> the erasing write's reply
    before: dict[str, set[str]] = field(default_factory=dict)  # store -> needles found, before erasure
    after: dict[str, set[str]] = field(default_factory=dict)
    answers_before: dict[str, str] = field(default_factory=dict)
    answers_after: dict[str, str] = field(default_factory=dict)
    vectors_before: dict[str, dict[str, tuple[str, str | None, str]]] = field(default_factory=dict)
    vectors_after: dict[str, dict[str, tuple[str, str | None, str]]] = field(default_factory=dict)
    replay_create: dict[str, Any] = field(default_factory=dict)  # the first create's reply, replayed later
    client: Any = None  # the module's client (the service runs for the whole module)
    head_before_erasure: int = 0

    def needles(self) -> dict[str, str]:
        return {**self.canary, "kept": self.kept, "meta": self.meta}

    def found(self, findings: dict[str, set[str]], needle: str) -> set[str]:
        return {store for store, names in findings.items() if needle in names}


async def scan_database(database_url: str, needles: dict[str, str]) -> dict[str, set[str]]:
    """Every column that can hold text, of every table (and materialized view) of every schema of the
    database → the names of the needles it holds. bytea is searched as bytes (the needles are ASCII), every
    other type through its text form (a tsvector's lexemes, a json value's serialization, an array's)."""
    found: dict[str, set[str]] = defaultdict(set)
    names, values = list(needles), list(needles.values())
    async with await psycopg.AsyncConnection.connect(database_url, autocommit=True) as conn:
        cur = await conn.execute(
            "SELECT n.nspname, c.relname, a.attname, format_type(a.atttypid, NULL), t.typcategory"
            " FROM pg_attribute a JOIN pg_class c ON c.oid = a.attrelid JOIN pg_namespace n ON n.oid = c.relnamespace"
            " JOIN pg_type t ON t.oid = a.atttypid"
            " WHERE c.relkind IN ('r', 'm', 'p') AND a.attnum > 0 AND NOT a.attisdropped"
            " AND n.nspname NOT IN ('pg_catalog', 'information_schema') AND n.nspname NOT LIKE 'pg\\_toast%%'"
            " AND n.nspname NOT LIKE 'pg\\_temp%%'")
        columns = await cur.fetchall()
        searched = 0
        for schema, table, column, kind, category in columns:
            if kind.rstrip("[]") not in TEXTUAL and category != "A":
                continue
            searched += 1
            target = sql.SQL("t.{}").format(sql.Identifier(column))
            test = (sql.SQL("position(convert_to(n.v, 'UTF8') in {}) > 0").format(target) if kind == "bytea"
                    else sql.SQL("strpos({}::text, n.v) > 0").format(target))
            hits = await conn.execute(sql.SQL(
                "SELECT n.name FROM unnest(%s::text[], %s::text[]) AS n(name, v)"
                " WHERE EXISTS (SELECT 1 FROM {}.{} t WHERE {})").format(
                    sql.Identifier(schema), sql.Identifier(table), test), (names, values))
            for (name,) in await hits.fetchall():
                found[f"{schema}.{table}.{column}"].add(name)
        assert searched > 20, f"only {searched} textual columns found: the scan is not looking"
        # Planner statistics sample column values (a bytea's histogram, a tsvector's most common lexemes):
        # the one catalog that copies content. Apart (STATISTICS), as ANALYZE, not the erasure, replaces them.
        for column in ("stavalues1", "stavalues2", "stavalues3", "stavalues4", "stavalues5"):
            hits = await conn.execute(sql.SQL(
                "SELECT n.name FROM unnest(%s::text[], %s::text[]) AS n(name, v) WHERE EXISTS"
                " (SELECT 1 FROM pg_catalog.pg_statistic t WHERE strpos(t.{}::text, n.v) > 0)").format(
                    sql.Identifier(column)), (names, values))
            for (name,) in await hits.fetchall():
                found[STATISTICS].add(name)
    return dict(found)


async def scan_stream(env: Env, needles: dict[str, str]) -> dict[str, set[str]]:
    """Every message of the module's JetStream stream (data and headers) → the needles it holds."""
    nc = await connect_nats(env.nats_url, "test-canary")
    try:
        js = nc.jetstream()
        info = await js.stream_info(env.settings.stream_name)
        found: set[str] = set()
        assert info.state.last_seq > 0
        for seq in range(info.state.first_seq, info.state.last_seq + 1):
            msg = await js.get_msg(env.settings.stream_name, seq)
            blob = (msg.data or b"") + json.dumps(msg.headers or {}).encode()
            found |= {name for name, value in needles.items() if value.encode() in blob}
        return {"jetstream": found}
    finally:
        await nc.close()


async def vector_rows(env: Env) -> dict[str, dict[str, tuple[str, str | None, str]]]:
    """space id → object_id → (version_id, content_digest, embedding text), every space."""
    out: dict[str, dict[str, tuple[str, str | None, str]]] = {}
    async with await psycopg.AsyncConnection.connect(env.database_url, autocommit=True) as conn:
        for space in await list_spaces(conn):
            cur = await conn.execute(sql.SQL("SELECT object_id, version_id, content_digest, embedding::text FROM {}"
                                             ).format(space.table))
            out[space.embedding_space_id] = {r[0]: (r[1], r[2], r[3]) for r in await cur.fetchall()}
    return out


async def answers(client: MemoryClient, world: World, version_ids: dict[str, list[str]]) -> dict[str, str]:
    """Everything the query side answers about the objects (replies and error envelopes): call → its text."""
    out: dict[str, str] = {}

    async def ask(label: str, call: Any) -> None:
        try:
            out[label] = json.dumps(await call, sort_keys=True)
        except PamspecError as exc:
            out[label] = json.dumps({"error": exc.code, "message": str(exc), "details": exc.details}, sort_keys=True)

    for shape, made in world.made.items():
        object_id = made.get("object_id") or made["relationship_id"]
        await ask(f"read {shape}", client.read(SCOPE, object_id))
        await ask(f"history {shape}", client.history(SCOPE, object_id))
        for n, version_id in enumerate(version_ids.get(shape, []), 1):
            await ask(f"read {shape} version {n}", client.read(SCOPE, object_id, version_id=version_id))
    await ask("query", client.query(SCOPE, limit=100, **EVERYTHING))
    for name, needle in world.needles().items():
        await ask(f"query text {name}", client.query(SCOPE, text=needle, limit=100, **EVERYTHING))
    if world.head_before_erasure:  # Query as of a sequence before the erasure (temporal: versions as they were)
        await ask("query as_of", client.query(SCOPE, limit=100, as_of_sequence=world.head_before_erasure,
                                              **EVERYTHING))
    for name, needle in world.needles().items():
        for mode in ("lexical", "semantic", "hybrid"):
            await ask(f"search {mode} {name}", client.search(SCOPE, text=needle, mode=mode, limit=50, wait_ms=10_000,
                                                             filter=EVERYTHING))
    return out


def holding(answers: dict[str, str], needle: str) -> list[str]:
    return sorted(label for label, text in answers.items() if needle in text)


async def caught_up(env: Env) -> bool:
    """Projector and indexer have applied the whole ledger (the indexer's outbox entries included)."""
    async with await psycopg.AsyncConnection.connect(env.database_url, autocommit=True) as conn:
        head = (await (await conn.execute("SELECT coalesce(max(ledger_sequence), 0) FROM ledger")).fetchone()
                or (0,))[0]
        outbox = (await (await conn.execute("SELECT count(*) FROM index_outbox")).fetchone() or (0,))[0]
        default = await find_space(conn, None)  # registered at the indexer's start, then filled
        return bool(outbox == 0 and default is not None and default.state == "ready"
                    and await checkpoint(conn) >= head and await checkpoint(conn, INDEX_CHECKPOINT) >= head)


async def settle(env: Env) -> None:
    async def twice() -> bool:  # the outbox's entries move the head once more: caught up on both looks
        return await caught_up(env) and await caught_up(env)
    await wait_for(twice, timeout=90, interval=0.2)


def provenance(meta: str, activity: str) -> dict[str, Any]:
    return {"provenance_id": f"prov:canary:{activity}", "actor": ACTOR, "activity": f"{activity} {meta}"}


async def write(client: MemoryClient, world: World) -> dict[str, list[str]]:
    """One object per shape; returns shape → the version ids written (read back one by one later)."""
    c = world.canary

    def prov(activity: str) -> dict[str, Any]:
        return provenance(world.meta, activity)

    versions: dict[str, list[str]] = defaultdict(list)
    body = {"scope_id": SCOPE, "object_type": "claim", "canonical_content": {"statement": f"the canary {c['deleted']}"},
            "actor": ACTOR, "provenance": prov("create"), "idempotency_key": f"canary:{uuid.uuid4()}"}
    first = await client.command("create", body)
    world.replay_create = {"body": body, "reply": first}
    updated = await client.update(SCOPE, first["object_id"], first["version_id"],
                                  {"statement": f"the canary {c['deleted']} again"}, ACTOR, prov("update"))
    world.made["deleted"] = updated
    versions["deleted"] += [first["version_id"], updated["version_id"]]
    world.made["partial"] = await client.create(SCOPE, "claim", {  # statement and summary are embedded
        "statement": f"the secret {c['partial']}", "summary": f"the kept part {world.kept}",
        "detail": {"who": f"the secret {c['partial']}", "n": [1, 2]}}, ACTOR, prov("create"))
    world.made["working_memory"] = await client.create(SCOPE, "working_memory", {
        "task_ref": "task:canary", "content": {"note": f"scratch {c['working_memory']}"}}, ACTOR, prov("create"))
    ends = [await client.create(SCOPE, "claim", {"statement": f"endpoint {i}"}, ACTOR, prov("create"))
            for i in (1, 2)]
    world.made["relationship"] = await client.command("relate", {
        "scope_id": SCOPE, "source_object_id": ends[0]["object_id"], "target_object_id": ends[1]["object_id"],
        "relationship_type": "supports", "directionality": "directed", "actor": ACTOR, "provenance": prov("relate"),
        "canonical_content": {"note": f"because {c['relationship']}"}})
    for shape in ("transitioned", "suppressed"):
        world.made[shape] = await client.create(SCOPE, "claim", {"statement": f"the canary {c[shape]}"}, ACTOR,
                                                prov("create"))
    world.made["partsupp"] = await client.create(SCOPE, "claim", {
        "statement": "a suppressed part", "detail": {"who": f"held back {c['partsupp']}"}}, ACTOR, prov("create"))
    for shape, made in world.made.items():
        if shape != "deleted":
            versions[shape].append(made["version_id"])
    return versions


async def erase(client: MemoryClient, world: World) -> None:
    m, prov = world.made, provenance(world.meta, "erase")

    def redact(shape: str, target: dict[str, Any]) -> dict[str, Any]:
        made = m[shape]
        return {"scope_id": SCOPE, "object_id": made.get("object_id") or made["relationship_id"],
                "expected_version_id": made["version_id"], "actor": ACTOR, "provenance": prov,
                "policy_basis": "gdpr:art17", "redaction_target": target}

    e = world.erasure
    e["deleted"] = await client.delete(SCOPE, m["deleted"]["object_id"], m["deleted"]["version_id"], ACTOR, prov)
    e["partial"] = await client.command("redact", redact("partial", {"pointers": ["/statement", "/detail/who"]}))
    e["working_memory"] = await client.command("redact", redact("working_memory", {}))
    e["relationship"] = await client.delete(SCOPE, m["relationship"]["relationship_id"],
                                            m["relationship"]["version_id"], ACTOR, prov)
    e["transitioned"] = await client.transition(SCOPE, m["transitioned"]["object_id"],
                                                m["transitioned"]["version_id"], "availability", "redacted",
                                                ACTOR, prov)
    e["suppressed"] = await client.command("redact", redact("suppressed", {"erase": False}))
    e["partsupp"] = await client.command("redact", redact("partsupp", {"pointers": ["/detail/who"], "erase": False}))


@pytest.fixture(scope="module")
async def world(env: Env) -> AsyncIterator[World]:
    async with serving(env, ALL_ROLES, roles=ALL_ROLES) as client:
        await client.create_scope(SCOPE)
        w = World(canary={shape: word(shape[:4]) for shape in SHAPES}, kept=word("kept"), meta=word("meta"))
        versions = await write(client, w)
        await settle(env)
        kept_before = await replay(env.database_url, ReplayOptions(keep=True))  # an audit copy made before
        async with await psycopg.AsyncConnection.connect(env.database_url, autocommit=True) as conn:
            for table in ("content_store", "current_objects"):  # what autovacuum's ANALYZE does, now
                await conn.execute(sql.SQL("ANALYZE {}").format(sql.Identifier(table)))
        w.before = {**await scan_database(env.database_url, w.needles()),
                    **await scan_stream(env, w.needles())}
        w.vectors_before = await vector_rows(env)
        w.answers_before = await answers(client, w, versions)
        async with await psycopg.AsyncConnection.connect(env.database_url, autocommit=True) as conn:
            row = await (await conn.execute("SELECT max(ledger_sequence) FROM ledger")).fetchone()
            w.head_before_erasure = int(row[0]) if row and row[0] else 0
        await erase(client, w)
        for shape, done in w.erasure.items():
            versions[shape].append(done["version_id"])
        await settle(env)
        await replay(env.database_url, ReplayOptions(keep=True))  # and one made after
        w.after = {**await scan_database(env.database_url, w.needles()),
                   **await scan_stream(env, w.needles())}
        w.vectors_after = await vector_rows(env)
        w.answers_after = await answers(client, w, versions)
        assert kept_before.get("table")
        w.client = client
        yield w


def test_every_canary_is_found_before_the_erasure(world: World) -> None:
    """The control: the scans find each canary where content lives, so their silence later means something."""
    for shape in SHAPES:
        stores = world.found(world.before, shape)
        assert "public.content_store.content" in stores, (shape, stores)
        assert holding(world.answers_before, world.canary[shape]), shape
    for shape in EMBEDDED:
        assert "public.current_objects.search" in world.found(world.before, shape), shape
        assert {f"search lexical {shape}", f"query text {shape}"} <= set(
            holding(world.answers_before, world.canary[shape])), shape
    assert world.canary["suppressed"] in world.answers_before["query"]
    spaces = world.vectors_before
    assert spaces, "no embedding space"
    for rows in spaces.values():
        for shape in EMBEDDED:
            assert rows[world.made[shape]["object_id"]][0] == world.made[shape]["version_id"], shape


def test_erased_content_is_in_no_column_of_any_table_and_not_in_the_stream(world: World) -> None:
    """Planner statistics aside: they hold samples until the next ANALYZE (`pamledger scrub` runs it)."""
    for shape in (*ERASED, "partial"):
        assert world.found(world.after, shape) - {STATISTICS} == set(), shape


def test_planner_statistics_sample_content(world: World) -> None:
    """The control for the statistics scan (cleared by scrub: test_scrub_...)."""
    assert world.before.get(STATISTICS, set()) & set(SHAPES)


def test_the_scans_still_find_what_remains_by_design(world: World) -> None:
    """Metadata (provenance.activity) is audit material: the ledger, the stored versions, the projection, the
    kept replay tables and the stream keep it. This is also the scans' control after the erasure."""
    stores = world.found(world.after, "meta")
    for store in ("public.ledger.event", "public.memory_versions.meta", "public.current_objects.meta", "jetstream"):
        assert store in stores, (store, stores)
    kept = [s for s in stores if s.startswith("public.current_objects_rebuild_")]
    assert len(kept) == 2, stores  # the replay kept before the erasure and the one kept after


def test_the_stream_never_held_content(world: World) -> None:
    assert world.before["jetstream"] == {"meta"}


def test_erased_content_is_in_no_answer_of_read_history_query_or_search(world: World) -> None:
    for shape in (*ERASED, "partial"):
        assert holding(world.answers_after, world.canary[shape]) == [], shape
    assert holding(world.answers_after, world.meta)  # the answers were given (and name the metadata)


def test_suppressed_content_is_in_no_answer_of_read_history_query_or_search(world: World) -> None:
    for shape in SUPPRESSED:
        assert holding({k: v for k, v in world.answers_after.items() if k != "query as_of"},
                       world.canary[shape]) == [], shape


def test_erased_content_is_not_in_a_query_as_of_before_the_erasure(world: World) -> None:
    for shape in (*ERASED, "partial"):
        assert world.canary[shape] not in world.answers_after["query as_of"], shape


def test_suppressed_content_is_not_in_a_query_as_of_before_the_suppression(world: World) -> None:
    for shape in SUPPRESSED:
        assert world.canary[shape] not in world.answers_after["query as_of"], shape


async def test_an_idempotent_replay_after_the_erasure_answers_without_the_content(world: World) -> None:
    """The idempotency record keeps ids and a request digest; a retry of the first create after the delete
    is answered from the ledger without the erased content."""
    try:
        replayed = await world.client.command("create", world.replay_create["body"])
        text = json.dumps(replayed)
        assert replayed["version_id"] == world.replay_create["reply"]["version_id"]
    except PamspecError as exc:
        text = json.dumps({"error": exc.code, "message": str(exc), "details": exc.details})
    assert world.canary["deleted"] not in text, text


def test_no_vector_of_an_erased_object_is_left_in_any_space(world: World) -> None:
    for rows in world.vectors_after.values():
        for shape in ERASED:
            made = world.made[shape]
            assert (made.get("object_id") or made["relationship_id"]) not in rows, shape
        assert world.made["suppressed"]["object_id"] not in rows  # suppressed: hidden from similarity too
        assert rows[world.made["partsupp"]["object_id"]][0] == world.erasure["partsupp"]["version_id"]


def test_a_partial_redaction_replaces_the_vector_by_the_projections(world: World) -> None:
    projection = world.erasure["partial"]
    content = msgspec.json.encode(projection["envelope"]["canonical_content"])
    assert world.canary["partial"].encode() not in content and world.kept.encode() in content
    for space_id, rows in world.vectors_after.items():
        version_id, _digest, embedding = rows[projection["object_id"]]
        assert version_id == projection["version_id"], space_id
        before = world.vectors_before[space_id][projection["object_id"]][2]
        assert embedding != before  # a vector of the projection, not the old one moved
    _check_projection_vector(world)


def _check_projection_vector(world: World) -> None:
    """The stored vector is the projection's text embedded (hashing spaces: no model to load)."""
    from embedding.known import descriptor_for
    from tests.conftest import TEST_SPACE

    descriptor = descriptor_for(TEST_SPACE)
    rows = world.vectors_after.get(descriptor.embedding_space_id)
    assert rows is not None
    embedder = embedder_for(descriptor, None)
    assert embedder is not None
    projection = world.erasure["partial"]
    text = text_of("claim", msgspec.json.encode(projection["envelope"]["canonical_content"]))
    expected = embedder.embed([text.text])[0]
    stored = json.loads(rows[projection["object_id"]][2])
    assert max(abs(a - b) for a, b in zip(stored, expected, strict=True)) < 1e-5


async def test_the_kept_part_of_a_partial_redaction_is_still_read_and_found(world: World) -> None:
    stores = world.found(world.after, "kept")
    assert {"public.content_store.content", "public.current_objects.search"} <= stores, stores
    object_id = world.erasure["partial"]["object_id"]
    read = await world.client.read(SCOPE, object_id)
    assert read["canonical_content"]["summary"] == f"the kept part {world.kept}"
    assert read["canonical_content"]["statement"] == read["canonical_content"]["detail"]["who"] == "[REDACTED]"
    shown = {**EVERYTHING, "availability_states": ["available", "partially_redacted"]}
    for mode in ("lexical", "hybrid"):
        found = await world.client.search(SCOPE, text=world.kept, mode=mode, wait_ms=10_000, filter=shown)
        assert [item["object_id"] for item in found["items"]][:1] == [object_id], mode
    gone = await world.client.search(SCOPE, text=world.canary["partial"], mode="lexical", wait_ms=10_000,
                                     filter=shown)
    assert gone["items"] == []


async def test_full_text_holds_the_projection_and_nothing_for_redacted_or_deleted_versions(world: World,
                                                                                             env: Env) -> None:
    async with await psycopg.AsyncConnection.connect(env.database_url, autocommit=True) as conn:
        cur = await conn.execute("SELECT object_id, availability_state, search::text FROM current_objects"
                                 " WHERE scope_id = %s", (SCOPE,))
        found = {r[0]: (r[1], r[2]) for r in await cur.fetchall()}
    state, search = found[world.erasure["partial"]["object_id"]]
    assert state == "partially_redacted" and search is not None
    assert world.kept in search and world.canary["partial"] not in search and "secret" not in search
    state, search = found[world.erasure["partsupp"]["object_id"]]
    assert state == "partially_redacted" and search is not None and world.canary["partsupp"] not in search
    for shape in ("deleted", "working_memory", "transitioned", "suppressed"):
        state, search = found[world.made[shape]["object_id"]]
        assert search is None, (shape, state)


def test_suppression_is_not_erasure_the_content_store_keeps_it(world: World) -> None:
    """erase=false hides the content from reads, full text and vectors, but content storage keeps it (a
    restoration can bring it back): documented in docs/security.md "Erasure"."""
    for shape in SUPPRESSED:
        assert world.found(world.after, shape) - {STATISTICS} == {"public.content_store.content"}, shape


async def test_scrub_runs_and_leaves_no_erased_bytes_in_the_databases_files(world: World, env: Env) -> None:
    """`pamledger scrub` (VACUUM FULL, CHECKPOINT, WAL switch): afterwards no file of the database's directory
    holds an erased canary, while live metadata and the kept part are found there (the control). Skipped where
    the data directory cannot be read (a server of your own, PAMLEDGER_TEST_DATABASE_URL)."""
    import asyncio
    from pathlib import Path

    done = await asyncio.to_thread(run_cli, env, "scrub")
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert report["checkpoint"] is True and report["wal_switched"]
    assert {"content_store", "current_objects"} <= set(report["vacuumed"])
    assert any(t.startswith("embedding_vectors_") for t in report["vacuumed"])
    assert '"phase": "vacuum"' in done.stderr  # progress, one JSON line per step
    async with await psycopg.AsyncConnection.connect(env.database_url, autocommit=True) as conn:
        row = await (await conn.execute(
            "SELECT current_setting('data_directory'), oid FROM pg_database WHERE datname = current_database()"
        )).fetchone()
    assert row is not None
    base = Path(row[0]) / "base" / str(row[1])
    statistics = (await scan_database(env.database_url, world.needles())).get(STATISTICS, set())
    assert statistics & {*ERASED, "partial"} == set()  # ANALYZE replaced the samples
    try:
        files = [p for p in base.iterdir() if p.is_file()]
    except OSError:
        pytest.skip(f"the data directory {base} is not readable here")
    blob = b"".join(p.read_bytes() for p in files)
    assert world.meta.encode() in blob and world.kept.encode() in blob  # the control: live rows are on disk
    for shape in (*ERASED, "partial"):
        assert world.canary[shape].encode() not in blob, (shape, [p.name for p in files
                                                                  if world.canary[shape].encode() in p.read_bytes()])


async def test_no_idempotency_record_keeps_an_unsalted_digest_of_erased_content(world: World, env: Env) -> None:
    from command_handler.core.intake import parse

    body = world.replay_create["body"]
    digest = parse("create", msgspec.json.encode(body), {}, 1 << 20).request_digest
    async with await psycopg.AsyncConnection.connect(env.database_url, autocommit=True) as conn:
        cur = await conn.execute("SELECT count(*) FROM idempotency_records WHERE request_digest = %s", (digest,))
        row = await cur.fetchone()
    assert row is not None and row[0] == 0
