"""[M5] `pamledger replay` rebuilds current_relationships with current_objects: byte-identical to the live one,
compared and swapped under the same checkpoint lock, scratch tables cleaned up."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import psycopg
import pytest
from psycopg import sql

from pamledger_client.client import MemoryClient
from projector.replay import KEPT_MARK, RELATIONSHIP_ROWS, ReplayOptions, projection_digest, replay
from tests.conftest import ACTOR, PROVENANCE, Env, run_cli, wait_for

SCOPES = ("workspace:relreplay-a", "workspace:relreplay-b")


async def _checkpoint(env: Env) -> int:
    async with await psycopg.AsyncConnection.connect(env.database_url) as conn:
        row = await (await conn.execute("SELECT coalesce(max(ledger_sequence), 0) FROM projection_checkpoints")
                     ).fetchone()
        return int(row[0]) if row else 0


async def _settled(client: MemoryClient, env: Env) -> None:
    head = client.last_sequence
    await wait_for(lambda: _at_least(env, head), timeout=30)


async def _at_least(env: Env, sequence: int) -> bool:
    return await _checkpoint(env) >= sequence


def _relate(scope: str, source: str, target: str, **extra: Any) -> dict[str, Any]:
    return {"scope_id": scope, "source_object_id": source, "target_object_id": target,
            "relationship_type": "supports", "directionality": "directed", "actor": ACTOR,
            "provenance": PROVENANCE, **extra}


@pytest.fixture(scope="module")
async def history(client: MemoryClient, service: Env) -> dict[str, Any]:
    """Objects and relationships: created, updated, transitioned, redacted, deleted, cross-scope, promoted."""
    made: dict[str, Any] = {}
    for scope in SCOPES:
        await client.create_scope(scope)
    for scope in SCOPES:
        ids = [(await client.create(scope, "claim", {"statement": f"{scope} {i}"}, ACTOR, PROVENANCE))["object_id"]
               for i in range(6)]
        rels = [await client.command("relate", _relate(scope, ids[i], ids[i + 1])) for i in range(5)]
        updated = await client.command("relate", _relate(scope, ids[0], ids[1], relationship_id=rels[0]["relationship_id"],
                                                         expected_version_id=rels[0]["version_id"],
                                                         canonical_content={"weight": 2}))
        await client.transition(scope, updated["relationship_id"], updated["version_id"], "validation", "corroborated",
                                ACTOR, PROVENANCE)
        await client.delete(scope, rels[1]["relationship_id"], rels[1]["version_id"], ACTOR, PROVENANCE)
        await client.command("redact", {"scope_id": scope, "object_id": rels[2]["relationship_id"],
                                        "expected_version_id": rels[2]["version_id"], "actor": ACTOR,
                                        "provenance": PROVENANCE, "policy_basis": "policy:test",
                                        "redaction_target": {"erase": True}})
        head = await client.read(scope, ids[5])
        await client.delete(scope, ids[5], head["version_id"], ACTOR, PROVENANCE)  # an endpoint gone
        made[scope] = {"objects": ids, "relationships": [r["relationship_id"] for r in rels]}
    other = made[SCOPES[1]]["objects"][0]
    await client.command("relate", _relate(SCOPES[0], made[SCOPES[0]]["objects"][0], other, target_scope_id=SCOPES[1],
                                           policy_basis="policy:cross"))
    wm = await client.create(SCOPES[0], "working_memory", {"task_ref": "task:1", "content": {"note": "to promote"}},
                             ACTOR, PROVENANCE)
    await client.command("promote", {"scope_id": SCOPES[0], "source_object_id": wm["object_id"],
                                     "expected_version_id": wm["version_id"], "target_object_type": "claim",
                                     "target_canonical_content": {"statement": "promoted"}, "actor": ACTOR,
                                     "provenance": PROVENANCE})
    await _settled(client, service)
    return made


async def _live_relationships(env: Env) -> int:
    async with await psycopg.AsyncConnection.connect(env.database_url) as conn:
        row = await (await conn.execute("SELECT count(*) FROM current_relationships")).fetchone()
        return int(row[0]) if row else 0


async def test_a_rebuild_equals_the_live_relationship_projection(history: dict[str, Any], service: Env) -> None:
    report = await replay(service.database_url, ReplayOptions(verify=True))
    assert report["verify"]["equal"], report["verify"]
    related = report["verify"]["relationships"]
    assert related["equal"] and related["live_digest"] == report["relationships"]["digest"]
    assert report["relationships"]["rows"] == await _live_relationships(service) == 5 + 5 + 1 + 1


async def test_a_first_load_digests_the_relationships_as_the_table_does(history: dict[str, Any], service: Env) -> None:
    """The plain rebuild digests rows as it reads them; that digest must be the table's."""
    plain = await replay(service.database_url, ReplayOptions())
    async with await psycopg.AsyncConnection.connect(service.database_url) as conn:
        live = await projection_digest(conn, "current_relationships", None, RELATIONSHIP_ROWS)
    assert (plain["relationships"]["digest"], plain["relationships"]["rows"]) == live
    scoped = await replay(service.database_url, ReplayOptions(scope_id=SCOPES[1], verify=True))
    assert scoped["verify"]["equal"] and scoped["relationships"]["rows"] == 5


async def test_verify_names_a_relationship_that_differs_and_a_swap_repairs_it(history: dict[str, Any],
                                                                               service: Env, client: MemoryClient
                                                                               ) -> None:
    victim = history[SCOPES[0]]["relationships"][3]
    async with await psycopg.AsyncConnection.connect(service.database_url, autocommit=True) as conn:
        async with conn.transaction():
            await conn.execute("SELECT 1 FROM projection_checkpoints FOR UPDATE")
            await conn.execute("UPDATE current_relationships SET lifecycle_state = 'deprecated'"
                               " WHERE relationship_id = %s", (victim,))
    report = await replay(service.database_url, ReplayOptions(verify=True))
    assert not report["verify"]["equal"] and report["verify"]["first_differences"] == []
    assert report["verify"]["relationships"]["first_differences"] == [
        {"scope_id": SCOPES[0], "relationship_id": victim, "problem": "rows differ"}]
    cli = await asyncio.to_thread(run_cli, service, "replay", "--verify")
    assert cli.returncode == 1 and json.loads(cli.stdout)["verify"]["equal"] is False
    swapped = await replay(service.database_url, ReplayOptions(swap=True))
    again = await replay(service.database_url, ReplayOptions(verify=True))
    assert again["verify"]["equal"] and again["relationships"]["digest"] == swapped["relationships"]["digest"]
    async with await psycopg.AsyncConnection.connect(service.database_url) as conn:
        cur = await conn.execute("SELECT indexname FROM pg_indexes WHERE tablename = 'current_relationships'"
                                 " ORDER BY indexname")
        assert [r[0] for r in await cur.fetchall()] == ["current_relationships_pkey", "current_relationships_source_idx",
                                                         "current_relationships_target_idx"]
    # the live projector keeps writing into the swapped-in table
    objects = history[SCOPES[1]]["objects"]
    made = await client.command("relate", _relate(SCOPES[1], objects[3], objects[0]))
    found = await client.related(SCOPES[1], objects[3], direction="outgoing")
    assert made["relationship_id"] in [e["relationship"]["relationship_id"] for e in found["edges"]]


async def test_a_kept_rebuild_keeps_both_tables_and_leftovers_are_dropped(history: dict[str, Any],
                                                                         service: Env) -> None:
    report = await replay(service.database_url, ReplayOptions(keep=True))
    kept = report["relationships"]["table"]
    assert kept.startswith("current_relationships_rebuild_")
    async with await psycopg.AsyncConnection.connect(service.database_url, autocommit=True) as conn:
        cur = await conn.execute("SELECT obj_description(%s::regclass, 'pg_class')", (kept,))
        assert await cur.fetchone() == (KEPT_MARK,)
        for table in (kept, report["table"]):
            await conn.execute(sql.SQL("DROP TABLE {}").format(sql.Identifier(table)))
        dead = "current_relationships_rebuild_deadbeef"
        await conn.execute(sql.SQL("CREATE UNLOGGED TABLE {} (x int)").format(sql.Identifier(dead)))
        await conn.execute(sql.SQL("COMMENT ON TABLE {} IS 'pamledger replay scratch, backend 999999'").format(
            sql.Identifier(dead)))
        await replay(service.database_url, ReplayOptions())
        cur = await conn.execute("SELECT relname FROM pg_class WHERE relname LIKE 'current\\_relationships\\_%%'")
        assert {r[0] for r in await cur.fetchall()} == {"current_relationships_pkey", "current_relationships_source_idx",
                                                         "current_relationships_target_idx"}


async def test_the_migration_backfills_what_the_projector_skipped_before_it(history: dict[str, Any],
                                                                          service: Env) -> None:
    """Relationships committed before 010 (when the projector skipped them) get the rows the projector writes."""
    from infra.migrations import migration_files

    text = next(sql_text for _, name, sql_text in migration_files() if name == "010_relationships.sql")
    backfill = text[text.index("-- BACKFILL"):]
    async with await psycopg.AsyncConnection.connect(service.database_url) as conn:
        await conn.execute("SELECT 1 FROM projection_checkpoints FOR UPDATE")  # the projector waits; rolled back
        await conn.execute("CREATE TEMP TABLE live_relationships AS SELECT * FROM current_relationships")
        await conn.execute("DELETE FROM current_relationships")
        await conn.execute(backfill.encode())
        cur = await conn.execute("SELECT count(*) FROM (SELECT * FROM live_relationships EXCEPT"
                                 " SELECT * FROM current_relationships) a")
        missing = await cur.fetchone()
        cur = await conn.execute("SELECT count(*) FROM (SELECT * FROM current_relationships EXCEPT"
                                 " SELECT * FROM live_relationships) a")
        extra = await cur.fetchone()
        cur = await conn.execute("SELECT count(*) FROM current_relationships")
        rows = await cur.fetchone()
        await conn.rollback()
    assert missing == (0,) and extra == (0,) and rows is not None and rows[0] >= 12
