"""Replay for audits: a rebuild equals the live projection byte for byte; audits at N never move."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import psycopg
from psycopg import sql
import pytest

from pamledger_client.client import MemoryClient
from projector.audit import audit
from projector.replay import KEPT_MARK, ReplayOptions, projection_digest, replay
from tests.conftest import run_cli, ACTOR, PROVENANCE, Env, wait_for

SCOPES = ("workspace:replay-a", "workspace:replay-b")
ROOT = Path(__file__).resolve().parents[2]


async def checkpoint(env: Env) -> int:
    async with await psycopg.AsyncConnection.connect(env.database_url) as conn:
        row = await (await conn.execute("SELECT coalesce(max(ledger_sequence), 0) FROM projection_checkpoints")
                     ).fetchone()
        return int(row[0]) if row else 0


async def settled(client: MemoryClient, env: Env) -> None:
    head = client.last_sequence
    await wait_for(lambda: _at_least(env, head), timeout=30)


async def _at_least(env: Env, sequence: int) -> bool:
    return await checkpoint(env) >= sequence


@pytest.fixture(scope="module")
async def history(client: MemoryClient, service: Env) -> dict[str, Any]:
    """A ledger with creates, updates, transitions of every dimension, a redaction and deletes."""
    made: dict[str, Any] = {}
    for scope in SCOPES:
        await client.create_scope(scope)
        for i in range(12):
            obj = await client.create(scope, "claim", {"statement": f"fact {i} about {scope}"}, ACTOR, PROVENANCE)
            if i % 3 == 0:
                obj = await client.update(scope, obj["object_id"], obj["version_id"], {"statement": f"fact {i} v2"},
                                          ACTOR, PROVENANCE)
            if i % 4 == 0:
                obj = await client.transition(scope, obj["object_id"], obj["version_id"], "validation",
                                              "corroborated", ACTOR, PROVENANCE)
            if i % 5 == 0:
                obj = await client.transition(scope, obj["object_id"], obj["version_id"], "lifecycle",
                                              "archived", ACTOR, PROVENANCE)
            if i == 7:
                obj = await client.transition(scope, obj["object_id"], obj["version_id"], "retention",
                                              "pending_deletion", ACTOR, PROVENANCE)
            if i == 8:
                obj = await client.transition(scope, obj["object_id"], obj["version_id"], "availability",
                                              "redacted", ACTOR, PROVENANCE)
            if i in (2, 9):
                obj = await client.delete(scope, obj["object_id"], obj["version_id"], ACTOR, PROVENANCE)
            made[f"{scope}/{i}"] = obj
    await settled(client, service)
    return made


async def test_a_rebuild_equals_the_live_projection_byte_for_byte(history: dict[str, Any], service: Env) -> None:
    report = await replay(service.database_url, ReplayOptions(verify=True))
    assert report["verify"]["equal"], report["verify"]["first_differences"]
    assert report["digest"] == report["verify"]["live_digest"]
    assert report["rows"] == 24 and report["events"] >= 24


async def test_a_scoped_rebuild_equals_that_scope_of_the_live_projection(history: dict[str, Any],
                                                                          service: Env) -> None:
    report = await replay(service.database_url, ReplayOptions(scope_id=SCOPES[1], verify=True))
    assert report["verify"]["equal"] and report["rows"] == 12


async def test_a_kept_rebuild_is_an_audit_copy_without_search_vectors(history: dict[str, Any],
                                                                      service: Env) -> None:
    """Nothing maintains a kept table, so it must not hold lexemes of content that may be erased later."""
    report = await replay(service.database_url, ReplayOptions(verify=True, keep=True))
    assert report["verify"]["equal"], "compared with its vectors, before they are dropped"
    async with await psycopg.AsyncConnection.connect(service.database_url, autocommit=True) as conn:
        cur = await conn.execute(sql.SQL("SELECT count(*), count(search) FROM {}").format(
            sql.Identifier(report["table"])))
        assert await cur.fetchone() == (report["rows"], 0)
        assert (await projection_digest(conn, report["table"], None))[0] == report["digest"]
        await conn.execute(sql.SQL("DROP TABLE {}").format(sql.Identifier(report["table"])))


async def test_a_replay_drops_the_scratch_tables_of_replays_that_died(history: dict[str, Any],
                                                                      service: Env) -> None:
    """Scratch tables hold lexemes and envelopes: one whose owning backend is gone must not linger."""
    async with await psycopg.AsyncConnection.connect(service.database_url, autocommit=True) as conn:
        mine = conn.info.backend_pid
        tables = {"replay_search_deadbeef": "pamledger replay scratch, backend 999999",  # owner gone
                  "current_objects_rebuild_deadbeef": None,  # left by a version that did not mark
                  "current_objects_rebuild_cafecafe": KEPT_MARK,  # --keep: on purpose
                  "replay_search_0badf00d": f"pamledger replay scratch, backend {mine}"}  # owner alive
        for name, mark in tables.items():
            await conn.execute(sql.SQL("CREATE UNLOGGED TABLE {} (x int)").format(sql.Identifier(name)))
            if mark is not None:
                await conn.execute(sql.SQL("COMMENT ON TABLE {} IS {}").format(sql.Identifier(name), sql.Literal(mark)))
        await replay(service.database_url, ReplayOptions())
        cur = await conn.execute("SELECT relname FROM pg_class WHERE relname = ANY(%s)", (list(tables),))
        assert {row[0] for row in await cur.fetchall()} == {"current_objects_rebuild_cafecafe", "replay_search_0badf00d"}
        for name in ("current_objects_rebuild_cafecafe", "replay_search_0badf00d"):
            await conn.execute(sql.SQL("DROP TABLE {}").format(sql.Identifier(name)))


async def test_verify_names_the_rows_that_differ(history: dict[str, Any], service: Env) -> None:
    victim = history[f"{SCOPES[0]}/4"]["object_id"]
    async with await psycopg.AsyncConnection.connect(service.database_url, autocommit=True) as conn:
        async with conn.transaction():
            await conn.execute("SELECT 1 FROM projection_checkpoints FOR UPDATE")
            await conn.execute("UPDATE current_objects SET lifecycle_state = 'deprecated' WHERE object_id = %s",
                               (victim,))
    report = await replay(service.database_url, ReplayOptions(verify=True))
    assert not report["verify"]["equal"]
    assert report["verify"]["first_differences"] == [
        {"scope_id": SCOPES[0], "object_id": victim, "problem": "rows differ"}]
    swapped = await replay(service.database_url, ReplayOptions(swap=True))  # repair by rebuilding
    async with await psycopg.AsyncConnection.connect(service.database_url, autocommit=True) as conn:
        cur = await conn.execute("SELECT obj_description('current_objects'::regclass, 'pg_class')")
        assert await cur.fetchone() == (None,), "a swapped-in rebuild is no longer marked as scratch"
    again = await replay(service.database_url, ReplayOptions(verify=True))
    assert again["verify"]["equal"] and again["digest"] == swapped["digest"]


async def test_query_keeps_answering_while_the_projection_is_swapped(history: dict[str, Any], client: MemoryClient,
                                                                      service: Env) -> None:
    answered = 0
    stop = asyncio.Event()

    async def ask() -> None:
        nonlocal answered
        while not stop.is_set():
            result = await client.query(SCOPES[0], lifecycle_states=["active", "archived"])
            assert result["items"]
            answered += 1

    asker = asyncio.create_task(ask())
    for _ in range(3):
        await replay(service.database_url, ReplayOptions(swap=True))
    stop.set()
    await asker
    assert answered > 0
    async with await psycopg.AsyncConnection.connect(service.database_url) as conn:
        cur = await conn.execute("SELECT reloptions FROM pg_class WHERE relname = 'current_objects_search_idx'")
        assert await cur.fetchone() == (["gin_pending_list_limit=256"],)  # a swapped-in rebuild keeps it
    created = await client.create(SCOPES[0], "claim", {"statement": "after swaps"}, ACTOR, PROVENANCE)
    found = await client.query(SCOPES[0], validation_states=["unverified"], text="swaps")
    assert [i["envelope"]["object_id"] for i in found["items"]] == [created["object_id"]]


async def test_audit_at_n_is_stable_after_later_writes(history: dict[str, Any], client: MemoryClient,
                                                       service: Env) -> None:
    scope = SCOPES[1]
    target = history[f"{scope}/5"]
    at = client.last_sequence
    async with await psycopg.AsyncConnection.connect(service.database_url) as conn:
        before = await audit(conn, scope, at, 0)
    assert {o["object_id"] for o in before["objects"]} >= {target["object_id"]}
    moved = await client.transition(scope, target["object_id"], target["version_id"], "lifecycle", "active",
                                    ACTOR, PROVENANCE, policy_basis="review:reactivated",
                                    policy_override=True)
    await client.delete(scope, moved["object_id"], moved["version_id"], ACTOR, PROVENANCE)
    await client.create(scope, "claim", {"statement": "later"}, ACTOR, PROVENANCE)
    async with await psycopg.AsyncConnection.connect(service.database_url) as conn:
        after = await audit(conn, scope, at, 0)
        now = await audit(conn, scope, client.last_sequence, 0)
    assert after == before
    assert now["digest"] != before["digest"]


async def test_the_cli_replays_audits_and_queries(history: dict[str, Any], service: Env) -> None:
    replayed = await asyncio.to_thread(run_cli, service, "replay", "--verify")
    assert replayed.returncode == 0, replayed.stderr
    assert json.loads(replayed.stdout)["verify"]["equal"] is True
    audited = await asyncio.to_thread(run_cli, service, "audit", "--scope", SCOPES[0], "--at", "5")
    assert json.loads(audited.stdout)["at_sequence"] == 5
    queried = await asyncio.to_thread(run_cli, service, "query", SCOPES[0], "--lifecycle", "archived",
                                      "--validation", "unverified", "--validation", "corroborated", "--limit", "3")
    items = json.loads(queried.stdout)["items"]
    assert items and all(i["envelope"]["lifecycle_state"] == "archived" for i in items)
    async with await psycopg.AsyncConnection.connect(service.database_url) as conn:
        digest, _ = await projection_digest(conn, "current_objects", None)
    assert json.loads(replayed.stdout)["digest"] == digest or json.loads(replayed.stdout)["verify"]["equal"]


async def test_status_names_every_role_and_how_far_the_projection_trails(history: dict[str, Any],
                                                                          service: Env) -> None:
    async def reported() -> dict[str, Any] | None:
        done = await asyncio.to_thread(run_cli, service, "status")
        report = json.loads(done.stdout)
        return report if done.returncode == 0 and report["postgres"]["projection_behind"] == 0 else None

    report = await wait_for(reported, timeout=60, interval=0.2)
    assert all(report[role]["answers"] for role in ("writer", "query", "projector", "gateway")), report
    assert report["postgres"]["projection_checkpoint"] == report["postgres"]["ledger_sequence"] > 0


async def test_small_json_batches_and_large_staged_batches_project_the_same_rows(
        history: dict[str, Any], service: Env) -> None:
    """The live projector writes small batches as one JSON-parameter statement, large ones through a COPY stage:
    both paths, and both orders of arrival, must leave identical rows."""
    from projector.rows import current_row
    from projector.store import apply_rows

    small = 10  # chunks of 7: JSON path; all: stage
    async with await psycopg.AsyncConnection.connect(service.database_url, autocommit=True) as conn:
        cur = await conn.execute("SELECT ledger_sequence, event FROM ledger ORDER BY ledger_sequence")
        rows = [r for seq, event in await cur.fetchall() if (r := current_row(bytes(event), seq)) is not None]
        assert len(rows) > 10, "the history must be big enough to take the staged path"
        for table in ("proj_small_batches", "proj_one_batch"):
            await conn.execute(f"CREATE TEMP TABLE {table} (LIKE current_objects INCLUDING ALL)")
        for start in range(0, len(rows), 7):  # many events per object: later rows replace earlier ones
            chunk = {(r[0], r[1]): r for r in rows[start:start + 7]}
            await apply_rows(conn, list(chunk.values()), 0, "proj_small_batches", small)
        latest = {(r[0], r[1]): r for r in rows}
        await apply_rows(conn, list(latest.values()), 0, "proj_one_batch", small)
        await apply_rows(conn, [rows[0]], 0, "proj_one_batch", small)  # an old event redelivered changes nothing
        for a, b in (("proj_small_batches", "proj_one_batch"), ("proj_one_batch", "proj_small_batches")):
            cur = await conn.execute(f"SELECT count(*) FROM (SELECT * FROM {a} EXCEPT SELECT * FROM {b}) d")
            assert (await cur.fetchone()) == (0,)
        cur = await conn.execute("SELECT count(*), count(search) FROM proj_one_batch")
        count, searchable = await cur.fetchone()  # type: ignore[misc]
        assert count == len(latest) and 0 < searchable < count  # deleted objects have no vector


async def test_the_json_path_stores_meta_byte_for_byte(history: dict[str, Any], service: Env) -> None:
    """Live batches carry `meta` as a JSON string: non-ASCII text, quotes, backslashes and escapes inside the
    canonical bytes must come back unchanged (a replay would otherwise differ from the live table)."""
    from projector.rows import current_row
    from projector.store import apply_rows

    async with await psycopg.AsyncConnection.connect(service.database_url, autocommit=True) as conn:
        cur = await conn.execute("SELECT ledger_sequence, event FROM ledger WHERE object_id IS NOT NULL"
                                 " ORDER BY ledger_sequence LIMIT 1")
        seq, event = await cur.fetchone()  # type: ignore[misc]
        row = current_row(bytes(event), seq)
        assert row is not None
        odd = row[-1][:-1] + ',"zz":"caf\u00e9 \u65e5\u672c \\"q\\" \\\\ \\u0000 \\n"}'.encode()
        await conn.execute("CREATE TEMP TABLE proj_meta_bytes (LIKE current_objects INCLUDING ALL)")
        await apply_rows(conn, [(*row[:-1], odd)], 0, "proj_meta_bytes")
        stored = await (await conn.execute("SELECT meta FROM proj_meta_bytes")).fetchone()
        assert stored is not None and bytes(stored[0]) == odd
