"""`verify` sees every tampering a superuser can do, and the writer refuses to append to a broken chain.

Each test tampers with its own copy of one written ledger (CREATE DATABASE ... TEMPLATE), bypassing the
append-only triggers the way a superuser can (session_replication_role = replica).
"""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import AsyncIterator

import psycopg
import pytest

from command_handler.verify import verify_ledger
from pamledger_client.client import MemoryClient, PamspecError
from tests.conftest import run_cli, ACTOR, PROVENANCE, Env, Servers, fresh_database, fresh_settings, running_service, wait_for

pytestmark = pytest.mark.profile("PAMSPEC-Ledger")  # docs/implementation-report.md

SCOPE = "workspace:verify"


@pytest.fixture(scope="module")
async def written(servers: Servers) -> AsyncIterator[Env]:
    """A ledger of creates, an update, a transition and a delete (one with an idempotency key), all
    relayed to the stream; the service is stopped before the tests copy it."""
    env = Env(servers, fresh_database(servers, "verify"), fresh_settings("verify"))
    async with running_service(env):
        client = await MemoryClient.connect(env.nats_url, env.settings.subject_prefix)
        await client.create_scope(SCOPE)
        made = [await client.create(SCOPE, "claim", {"n": i}, ACTOR, PROVENANCE) for i in range(3)]
        await client.create(SCOPE, "claim", {"n": "keyed"}, ACTOR, PROVENANCE, idempotency_key="k:verify")
        updated = await client.update(SCOPE, made[0]["object_id"], made[0]["version_id"], {"n": "new"}, ACTOR,
                                      PROVENANCE)
        await client.transition(SCOPE, updated["object_id"], updated["version_id"], "validation", "corroborated",
                                ACTOR, PROVENANCE)
        await client.delete(SCOPE, made[1]["object_id"], made[1]["version_id"], ACTOR, PROVENANCE)
        await wait_for(lambda: _relayed(client, 7), timeout=60)
        await client.close()
    yield env


async def _relayed(client: MemoryClient, head: int) -> bool:
    return bool((await client.status("writer"))["relayed_sequence"] == head)


def copy_of(env: Env) -> str:
    name = f"t_verify_copy_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(env.servers.admin_url, autocommit=True) as conn:
        conn.execute(f"CREATE DATABASE {name} TEMPLATE {env.database_url.rsplit('/', 1)[1]}")
    return env.servers.database_url(name)


async def tamper(database_url: str, *statements: str) -> None:
    async with await psycopg.AsyncConnection.connect(database_url, autocommit=True) as conn:
        await conn.execute("SET session_replication_role = replica")  # no triggers: what a superuser can do
        for statement in statements:
            await conn.execute(statement)


async def test_an_untouched_ledger_verifies_and_is_anchored_on_the_stream(written: Env) -> None:
    result = await verify_ledger(written.database_url, written.nats_url, written.settings.stream_name)
    assert result["ok"], result
    assert result["rows_checked"] == 7 and result["anchored_sequence"] == 7 and result["stream_behind"] == 0


async def test_without_nats_verify_says_the_head_is_not_anchored(written: Env) -> None:
    result = await verify_ledger(written.database_url)
    assert not result["ok"] and result["check"] == "stream.head" and "not anchored" in result["reason"]


async def test_deleting_the_last_rows_is_seen_as_a_truncated_tail(written: Env) -> None:
    copy = copy_of(written)
    await tamper(copy, "DELETE FROM ledger WHERE ledger_sequence > 5",  # and everything they wrote
                 "DELETE FROM memory_versions WHERE ledger_sequence > 5",
                 "DELETE FROM idempotency_records WHERE ledger_sequence > 5",
                 "DELETE FROM content_store c WHERE NOT EXISTS"
                 " (SELECT 1 FROM memory_versions v WHERE v.content_digest = c.content_digest)")
    result = await verify_ledger(copy, written.nats_url, written.settings.stream_name)
    assert not result["ok"], result
    assert (result["check"], result["first_bad_sequence"]) == ("stream.head", 6)
    assert "truncated" in result["reason"]
    # the delete at 7 went with the tail, so the object made at 2 is live without content: named, second
    assert (result["also"]["check"], result["also"]["first_bad_sequence"]) == ("content_store", 2), result


@pytest.mark.parametrize(("statement", "sequence", "check"), [
    ("UPDATE ledger SET scope_id = 'workspace:elsewhere' WHERE ledger_sequence = 2", 2, "ledger.scope_id"),
    ("UPDATE ledger SET object_id = 'mem:forged' WHERE ledger_sequence = 3", 3, "ledger.object_id"),
    ("UPDATE ledger SET version_id = 'ver:forged' WHERE ledger_sequence = 3", 3, "ledger.version_id"),
    ("UPDATE ledger SET event_type = 'object_updated' WHERE ledger_sequence = 1", 1, "ledger.event_type"),
    ("UPDATE ledger SET event_id = 'evt:forged' WHERE ledger_sequence = 4", 4, "ledger.event_id"),
    ("UPDATE ledger SET operation_id = 'op:forged' WHERE ledger_sequence = 4", 4, "ledger.operation_id"),
    ("UPDATE ledger SET recorded_at = recorded_at - interval '1 day' WHERE ledger_sequence = 5", 5,
     "ledger.recorded_at"),
    ("UPDATE memory_versions SET meta = convert_to(replace(convert_from(meta, 'UTF8'), 'unverified',"
     " 'verified'), 'UTF8') WHERE ledger_sequence = 2", 2, "memory_versions.meta"),
    ("UPDATE memory_versions SET content_digest = 'sha256:00' WHERE ledger_sequence = 3", 3,
     "memory_versions.content_digest"),
    ("UPDATE memory_versions SET object_id = 'mem:forged' WHERE ledger_sequence = 4", 4,
     "memory_versions.object_id"),
    ("DELETE FROM memory_versions WHERE ledger_sequence = 4", 4, "memory_versions"),
    ("UPDATE content_store SET content = convert_to('{\"n\":\"forged\"}', 'UTF8')"
     " WHERE content_digest = (SELECT content_digest FROM memory_versions WHERE ledger_sequence = 3)", 3,
     "content_store.content"),
    ("UPDATE idempotency_records SET ledger_sequence = 2", 2, "idempotency_records.ledger_row"),
    # content of a live object (the delete at 7 erased only the object created at 2)
    ("DELETE FROM content_store WHERE content_digest = (SELECT content_digest FROM memory_versions"
     " WHERE ledger_sequence = 3)", 3, "content_store"),
    ("DELETE FROM content_store WHERE content_digest = (SELECT content_digest FROM memory_versions"
     " WHERE ledger_sequence = 1)", 1, "content_store"),
])
async def test_a_column_outside_the_row_hash_is_checked_against_the_event(
        written: Env, statement: str, sequence: int, check: str) -> None:
    copy = copy_of(written)
    await tamper(copy, statement)
    result = await verify_ledger(copy, written.nats_url, written.settings.stream_name)
    assert not result["ok"], result
    assert (result["check"], result["first_bad_sequence"]) == (check, sequence), result


async def test_a_forged_row_no_ledger_row_accounts_for_is_named(written: Env) -> None:
    copy = copy_of(written)
    await tamper(copy, "INSERT INTO content_store SELECT 'sha256:forged', scope_id, object_id, salt, content"
                       " FROM content_store LIMIT 1")
    result = await verify_ledger(copy, written.nats_url, written.settings.stream_name)
    assert not result["ok"] and result["check"] == "content_store.version", result


async def test_the_writer_refuses_to_append_to_a_broken_tail_until_it_is_repaired(written: Env) -> None:
    copy = copy_of(written)
    await tamper(copy, "CREATE TABLE saved AS SELECT * FROM ledger WHERE ledger_sequence = 7",
                 "UPDATE ledger SET event = convert_to(replace(convert_from(event, 'UTF8'), 'claim', 'CLAIM'),"
                 " 'UTF8') WHERE ledger_sequence = 7")
    env = Env(written.servers, copy, fresh_settings("verify_tail"))  # its own stream: it appends
    async with running_service(env):
        client = await MemoryClient.connect(env.nats_url, env.settings.subject_prefix)
        client.retries = 0
        status = await client.status("writer")
        assert "ledger row 7" in status["chain_broken"]
        with pytest.raises(PamspecError) as refused:
            await client.create(SCOPE, "claim", {"n": "after"}, ACTOR, PROVENANCE)
        assert refused.value.code == "service_unavailable" and "chain" in refused.value.message
        await tamper(copy, "UPDATE ledger l SET event = s.event FROM saved s WHERE l.ledger_sequence = 7")
        created = await client.create(SCOPE, "claim", {"n": "repaired"}, ACTOR, PROVENANCE)
        assert created["ledger_sequence"] == 8
        assert (await client.status("writer"))["chain_broken"] is None
        await client.close()


async def test_the_cli_verify_exits_2_and_names_the_row_and_check(written: Env) -> None:
    intact = await asyncio.to_thread(run_cli, written, "verify")
    assert intact.returncode == 0 and json.loads(intact.stdout)["anchored_sequence"] == 7, intact.stderr
    copy = copy_of(written)
    await tamper(copy, "UPDATE ledger SET scope_id = 'workspace:elsewhere' WHERE ledger_sequence = 6")
    tampered = await asyncio.to_thread(lambda: run_cli(written, "verify", database_url=copy))
    report = json.loads(tampered.stdout)
    assert tampered.returncode == 2 and (report["first_bad_sequence"], report["check"]) == (6, "ledger.scope_id")


async def test_verify_on_a_live_ledger_never_reports_rows_appended_during_its_run(servers: Servers) -> None:
    """Creates and the indexer's entries are appended while verify runs again and again: every run is ok (the
    stream's position is compared with the ledger as it is after the stream was read, not with the head the
    pass began with, which once reported a truncated tail on a healthy ledger)."""
    from pamledger.supervisor import ROLES as ALL_ROLES
    from tests.conftest import serving

    env = Env(servers, fresh_database(servers, "verify_live"), fresh_settings("verify_live"))
    async with serving(env, ALL_ROLES, roles=ALL_ROLES) as client:
        await client.create_scope(SCOPE)
        stop = asyncio.Event()

        async def load() -> int:
            made = 0
            while not stop.is_set():
                await asyncio.gather(*(client.create(SCOPE, "claim", {"n": made + i}, ACTOR, PROVENANCE)
                                       for i in range(8)))
                made += 8
            return made

        writing = asyncio.create_task(load())
        try:
            results = [await verify_ledger(env.database_url, env.nats_url, env.settings.stream_name)
                       for _ in range(12)]
        finally:
            stop.set()
            made = await writing
    assert made > 0
    assert [r for r in results if not r["ok"]] == []
    assert any(r["appended_during_verify"] > 0 for r in results), "nothing was appended during a run: no test"
