"""A stream, checkpoint or subscription position of another ledger (or ahead of this one) is refused, and the
explicit recovery commands (`pamledger stream rebuild`, `pamledger replay --swap`) heal the running service."""

from __future__ import annotations

from typing import Any

import psycopg

from infra.ledger_identity import STREAM_KEY, checkpoint_disagreement, ledger_identity
from infra.projections import PROJECTION, checkpoint
from pamledger_client.client import MemoryClient
from pamledger.cli_ledger import identity_report, rebuild_stream
from projector.replay import ReplayOptions, replay
from subscriptions.store import subscriptions_disagreement
from tests.conftest import ACTOR, PROVENANCE, answers, Env, Servers, fresh_database, fresh_settings, running_service, serving, wait_for

SCOPE = "workspace:identity"


async def write(client: MemoryClient, n: int) -> list[dict[str, Any]]:
    return [await client.create(SCOPE, "claim", {"n": i}, ACTOR, PROVENANCE) for i in range(n)]


async def projected(client: MemoryClient, object_id: str) -> bool:
    items = (await client.query(SCOPE, min_sequence=0, validation_states=["unverified"]))["items"]
    return object_id in {item["envelope"]["object_id"] for item in items}


async def test_a_stream_of_a_re_created_database_is_refused_until_rebuilt(servers: Servers) -> None:
    settings = fresh_settings("identity")
    old = Env(servers, fresh_database(servers, "identity_old"), settings)
    async with running_service(old):
        client = await MemoryClient.connect(old.nats_url, settings.subject_prefix)
        await client.create_scope(SCOPE)
        await write(client, 5)
        await wait_for(lambda: _relayed(client, 5), timeout=60)
        await client.close()
    new = Env(servers, fresh_database(servers, "identity_new"), settings)  # the database was re-created
    async with serving(new, ("writer",)) as client:
        await client.create_scope(SCOPE)
        created = (await write(client, 1))[0]
        status = await wait_for(lambda: _refused(client), timeout=60)
        async with await psycopg.AsyncConnection.connect(new.database_url, autocommit=True) as conn:
            ledger_id = await ledger_identity(conn, 0)
        reason = status["relay_refused"]
        assert "another ledger" in reason and ledger_id in reason and "pamledger stream rebuild" in reason
        assert status["relayed_sequence"] == 0
        assert not await projected(client, created["object_id"])
        shown = await identity_report(settings, client.nc, new.database_url)  # what `pamledger status` prints
        assert not shown["agrees"] and "stream belongs to another ledger" in shown["problems"][0]

        report = await rebuild_stream(settings, new.nats_url, new.database_url)
        assert report["previous"]["last_sequence"] == 5 and report["previous"]["ledger_id"] != ledger_id
        assert report["ledger_id"] == ledger_id and report["republished_through"] == 1
        await wait_for(lambda: projected(client, created["object_id"]), timeout=60, interval=0.2)
        later = (await write(client, 1))[0]
        await wait_for(lambda: projected(client, later["object_id"]), timeout=60, interval=0.2)
        assert (await client.status("writer"))["relay_refused"] is None
        assert (await identity_report(settings, client.nc, new.database_url))["agrees"]
        info = await client.nc.jetstream().stream_info(settings.stream_name)
        assert (info.config.metadata or {})[STREAM_KEY] == ledger_id
        assert await wait_for(lambda: answers(client, ("gateway",)), timeout=60)


async def _relayed(client: MemoryClient, head: int) -> bool:
    return bool((await client.status("writer"))["relayed_sequence"] == head)


async def _refused(client: MemoryClient) -> dict[str, Any] | None:
    status = await client.status("writer")
    return status if status.get("relay_refused") else None


async def test_a_checkpoint_ahead_of_the_ledger_is_refused_until_replay_swaps_it(servers: Servers) -> None:
    env = Env(servers, fresh_database(servers, "identity_ckpt"), fresh_settings("identity_ckpt"))
    async with running_service(env):
        client = await MemoryClient.connect(env.nats_url, env.settings.subject_prefix)
        await client.create_scope(SCOPE)
        first = (await write(client, 2))[-1]
        await wait_for(lambda: projected(client, first["object_id"]), timeout=60, interval=0.2)
        await client.close()
    async with await psycopg.AsyncConnection.connect(env.database_url, autocommit=True) as conn:
        # as after restoring an older backup of the ledger beside a newer projection
        await conn.execute("UPDATE projection_checkpoints SET ledger_sequence = 50")
        refusal = await checkpoint_disagreement(conn, PROJECTION, 0)
        assert refusal is not None and "ahead" in refusal.message() and "replay --swap" in refusal.message()
    async with serving(env, ("writer",)) as client:
        created = (await write(client, 1))[0]
        await wait_for(lambda: _relayed(client, 3), timeout=60)
        assert not await projected(client, created["object_id"])  # the projector refuses the checkpoint
        report = await replay(env.database_url, ReplayOptions(swap=True))
        assert report["checkpoint_reset"]["from"] == 50 and report["checkpoint_reset"]["to"] == 3
        await wait_for(lambda: projected(client, created["object_id"]), timeout=60, interval=0.2)
        later = (await write(client, 1))[0]
        await wait_for(lambda: projected(client, later["object_id"]), timeout=60, interval=0.2)
    async with await psycopg.AsyncConnection.connect(env.database_url, autocommit=True) as conn:
        assert await checkpoint(conn) == 4


async def test_a_checkpoint_or_subscription_of_another_ledger_disagrees(servers: Servers) -> None:
    database_url = fresh_database(servers, "identity_rows")
    async with await psycopg.AsyncConnection.connect(database_url, autocommit=True) as conn:
        ledger_id = await ledger_identity(conn, 0)
        assert await ledger_identity(conn, 0) == ledger_id  # made once, then kept
        await conn.execute("INSERT INTO projection_checkpoints (projection, ledger_sequence, ledger_id)"
                           " VALUES (%s, 0, 'ledger:other')", (PROJECTION,))
        refusal = await checkpoint_disagreement(conn, PROJECTION, 0)
        assert refusal is not None and refusal.found_ledger_id == "ledger:other" and ledger_id in refusal.message()
        await conn.execute("INSERT INTO subscriptions (subscription_id, scope_id, request, start_sequence,"
                           " acked_sequence) VALUES ('sub:ahead', %s, '\\x7b7d', 40, 40)", (SCOPE,))
        refusal = await subscriptions_disagreement(conn, 0)
        assert refusal is not None and "sub:ahead" in refusal.message() and refusal.found_sequence == 40


async def test_a_stream_made_before_identities_is_adopted_when_it_is_this_ledgers(servers: Servers) -> None:
    """A stream without the metadata (made before this release) is stamped when its last message is the
    ledger's row at that sequence, and refused when it holds more than the ledger."""
    from command_handler.relay import ensure_stream
    from infra.ledger_identity import stream_disagreement

    settings = fresh_settings("identity_legacy")
    database_url = fresh_database(servers, "identity_legacy")
    client = await MemoryClient.connect(servers.nats_url, settings.subject_prefix)
    js = client.nc.jetstream()
    try:
        await ensure_stream(js, settings.stream_name, settings.subject_prefix)  # no ledger id: a legacy stream
        async with await psycopg.AsyncConnection.connect(database_url, autocommit=True) as conn:
            assert await stream_disagreement(conn, js, settings.stream_name, 0) is None
            info = await js.stream_info(settings.stream_name)
            assert (info.config.metadata or {})[STREAM_KEY] == await ledger_identity(conn, 0)
            other = fresh_settings("identity_legacy2")
            await ensure_stream(js, other.stream_name, other.subject_prefix)
            await js.publish(f"{other.subject_prefix}.ledger.p0.x.object_created", b"{}",
                             headers={"Nats-Msg-Id": "evt:elsewhere"})
            refusal = await stream_disagreement(conn, js, other.stream_name, 0)
            assert refusal is not None and refusal.found_ledger_id is None and "ahead" in refusal.problem
            await js.delete_stream(other.stream_name)
        await js.delete_stream(settings.stream_name)
    finally:
        await client.close()
