"""The writer never reuses a ledger sequence the stream has seen: over a ledger whose tail was cut off (as a
superuser can) it refuses to append until `pamledger stream rebuild --force`, which without --force keeps
the stream (the only proof of the cut) and lists what it would throw away."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import nats
import psycopg
import pytest

from command_handler.guard import AppendGuard
from command_handler.store import PostgresLedgerStore
from infra.ledger_identity import stream_disagreement, stream_reuse
from pamledger.cli_ledger import rebuild_stream
from pamledger_client.client import MemoryClient, PamspecError
from tests.conftest import run_cli, ACTOR, PROVENANCE, Env, Servers, fresh_database, fresh_settings, running_service, serving, wait_for

SCOPE = "workspace:reuse"


async def written(servers: Servers, label: str, n: int) -> tuple[Env, list[dict[str, Any]]]:
    """A ledger of `n` creates, all relayed to the stream; the service stopped."""
    env = Env(servers, fresh_database(servers, label), fresh_settings(label))
    async with running_service(env):
        client = await MemoryClient.connect(env.nats_url, env.settings.subject_prefix)
        await client.create_scope(SCOPE)
        made = [await client.create(SCOPE, "claim", {"n": i}, ACTOR, PROVENANCE) for i in range(n)]
        await wait_for(lambda: _relayed(client, n), timeout=60)
        await client.close()
    return env, made


async def _relayed(client: MemoryClient, head: int) -> bool:
    return bool((await client.status("writer"))["relayed_sequence"] == head)


async def tamper(database_url: str, *statements: str) -> None:
    async with await psycopg.AsyncConnection.connect(database_url, autocommit=True) as conn:
        await conn.execute("SET session_replication_role = replica")  # no triggers: what a superuser can do
        for statement in statements:
            await conn.execute(statement)


def cut_after(sequence: int) -> list[str]:
    """Delete the ledger's rows after `sequence` and everything they wrote."""
    return [f"DELETE FROM ledger WHERE ledger_sequence > {sequence}",
            f"DELETE FROM memory_versions WHERE ledger_sequence > {sequence}",
            f"DELETE FROM idempotency_records WHERE ledger_sequence > {sequence}",
            "DELETE FROM content_store c WHERE NOT EXISTS"
            " (SELECT 1 FROM memory_versions v WHERE v.content_digest = c.content_digest)"]


async def test_a_writer_over_a_cut_off_tail_refuses_until_the_stream_is_rebuilt_with_force(servers: Servers) -> None:
    env, made = await written(servers, "reuse_cut", 7)
    await tamper(env.database_url, *cut_after(5))
    async with serving(env, ("writer",)) as client:
        status = await client.status("writer")
        assert "ahead of the ledger" in status["stream_refused"] and status["ledger_sequence"] == 5, status
        with pytest.raises(PamspecError) as refused:
            await client.create(SCOPE, "claim", {"n": "reused?"}, ACTOR, PROVENANCE)
        assert refused.value.code == "service_unavailable" and "sequences the ledger lacks" in refused.value.message
        assert refused.value.details["stream_sequence"] == 7 and refused.value.details["ledger_head"] == 5

        discarded = [{"sequence": 6, "event_id": made[5]["event_id"]}, {"sequence": 7, "event_id": made[6]["event_id"]}]
        cli = await asyncio.to_thread(run_cli, env, "stream", "rebuild")
        assert cli.returncode != 0 and not cli.stdout, cli
        error = json.loads(cli.stderr.strip().splitlines()[-1])["error"]
        assert error["code"] == "invalid_request" and "--force" in error["message"]
        assert error["details"]["would_discard"] == discarded
        info = await client.nc.jetstream().stream_info(env.settings.stream_name)
        assert info.state.last_seq == 7  # kept: the only proof of the cut

        report = await rebuild_stream(env.settings, env.nats_url, env.database_url, force=True)
        assert report["previous"]["discarded"] == discarded and report["republished_through"] == 5
        created = await wait_for(lambda: _create(client), timeout=60)
        assert created["ledger_sequence"] == 6 and created["event_id"] != made[5]["event_id"]
        assert (await client.status("writer"))["stream_refused"] is None


async def _create(client: MemoryClient) -> dict[str, Any] | None:
    try:
        return await client.create(SCOPE, "claim", {"n": "after the rebuild"}, ACTOR, PROVENANCE)
    except PamspecError as exc:
        assert exc.code == "service_unavailable", exc
        return None


async def test_a_stream_holding_another_event_at_its_last_sequence_is_refused(servers: Servers) -> None:
    """The stream is not ahead, but its last message is not the ledger's row there (sequences reused)."""
    env, _ = await written(servers, "reuse_fork", 3)
    await tamper(env.database_url, "UPDATE ledger SET event_id = 'evt:reused' WHERE ledger_sequence = 3")
    nc = await nats.connect(env.nats_url)
    try:
        js = nc.jetstream()
        async with await psycopg.AsyncConnection.connect(env.database_url, autocommit=True) as conn:
            relay_refusal = await stream_disagreement(conn, js, env.settings.stream_name, 0)
            writer_refusal = await stream_reuse(conn, js, env.settings.stream_name, 0)
    finally:
        await nc.close()
    assert relay_refusal is not None and "another event than the ledger at sequence 3" in relay_refusal.message()
    assert writer_refusal is not None and writer_refusal.found_sequence == 3


async def test_without_jetstream_the_writer_appends_and_checks_again_later(servers: Servers) -> None:
    """Postgres is the source of truth: a stream check NATS cannot answer does not stop the writer; it is
    retried (after writer.stream_check_seconds) before a later batch."""
    env, _ = await written(servers, "reuse_nonats", 1)
    settings = env.settings.model_copy(update={"writer": env.settings.writer.model_copy(
        update={"stream_check_seconds": 0.2})})
    nc = await nats.connect(env.nats_url)
    await nc.close()  # every JetStream call now fails at once
    async with await psycopg.AsyncConnection.connect(env.database_url, autocommit=True) as conn:
        guard = AppendGuard(settings, PostgresLedgerStore(conn), nc)
        await guard.check()
        assert guard.refusal() is None and guard.stream_unchecked is not None
        assert not guard.due()
        await wait_for(guard.due, timeout=30)
