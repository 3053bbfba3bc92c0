"""Subscribe with several partitions: a scope of any partition is subscribed to exactly as with one (push and
poll, resume, ack, status, list, close), its requests routed to its partition's gateway; a killed gateway
process's partitions are taken over by another, and delivery goes on with every event once, in order.

The takeover test runs its gateways as real subprocesses (`python -m pamledger serve --roles gateway`), so a
kill is a real kill.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import nats
import psycopg
import pytest

from infra.partitions import partition_of
from pamledger_client.client import MemoryClient, PamspecError
from pamledger_client.subscription import Subscription
from tests.conftest import ACTOR, PROVENANCE, Env, Servers, fresh_database, fresh_settings, service_environment, \
    serving, stop_process, take, wait_for

pytestmark = pytest.mark.profile("PAMSPEC-Subscribe")

ROOT = Path(__file__).resolve().parents[2]
PARTITIONS = 2
ROLES = ("writer", "query", "projector")


def scope_in(partition: int, label: str) -> str:
    """A scope id that hashes to `partition`."""
    return next(s for i in range(1000) if partition_of(s := f"workspace:{label}-{i}", PARTITIONS) == partition)


@pytest.fixture(scope="module")
def env(servers: Servers) -> Env:
    return Env(servers, fresh_database(servers, "subparts"), fresh_settings("subparts", partitions=PARTITIONS))


async def make(client: MemoryClient, scope_id: str, count: int) -> list[Any]:
    return [await client.create(scope_id, "claim", {"n": i}, ACTOR, PROVENANCE) for i in range(count)]




def created(events: list[dict[str, Any]]) -> list[str]:
    return [e["event"]["object_id"] for e in events if e["event"]["event_type"] == "object_created"]


async def status_of(nc: Any, env: Env, component: str) -> dict[str, Any] | None:
    try:
        msg = await nc.request(f"{env.settings.subject_prefix}.status.{component}", b"{}", timeout=1)
    except (nats.errors.TimeoutError, nats.errors.NoRespondersError):
        return None
    result: dict[str, Any] = json.loads(msg.data)["result"]
    return result


async def test_a_scope_of_another_partition_is_subscribed_to_push_and_poll(env: Env) -> None:
    elsewhere, home = scope_in(1, "subp"), scope_in(0, "subp")
    async with serving(env, (*ROLES, "gateway"), roles=(*ROLES, "gateway")) as client:
        client.retries = 3
        for scope_id in (home, elsewhere):
            await client.create_scope(scope_id)
        before = await make(client, elsewhere, 4)
        start = before[0]["ledger_sequence"] - 1
        push = await client.subscribe(elsewhere, ACTOR, after_sequence=start,
                                      filter={"event_classes": ["object_created"]})
        home_push = await client.subscribe(home, ACTOR, filter={"event_classes": ["object_created"]})
        poll = await client.subscription_request("open", {
            "scope_id": elsewhere, "actor": ACTOR, "after_sequence": start,
            "filter": {"event_classes": ["object_created"]}, "delivery": {"mode": "poll"}})
        poll_id = poll["subscription_id"]
        after = await make(client, elsewhere, 4)
        home_made = await make(client, home, 2)
        expected = [o["object_id"] for o in before + after]

        pushed = await take(push, 8)
        assert created(pushed) == expected  # every event once, in order
        assert created(await take(home_push, 2)) == [o["object_id"] for o in home_made]
        first = await client.subscription_request("poll", {"subscription_id": poll_id, "max_events": 5})
        second = await client.subscription_request("poll", {"subscription_id": poll_id, "max_events": 5})
        assert created(first["events"] + second["events"]) == expected
        await client.subscription_request("ack", {"subscription_id": poll_id,
                                                  "ledger_sequence": after[-1]["ledger_sequence"]})
        status = await client.subscription_request("status", {"subscription_id": poll_id})
        assert status["acknowledged_sequence"] == after[-1]["ledger_sequence"]
        # Resume from the start: the poll subscription delivers everything again, from partition 1's stream.
        await client.subscription_request("resume", {"subscription_id": poll_id, "after_sequence": start})
        again = await client.subscription_request("poll", {"subscription_id": poll_id, "max_events": 20})
        assert created(again["events"]) == expected

        listed = await client.subscription_request("list", {})
        ids = {s["subscription_id"]: s["scope_id"] for s in listed["subscriptions"]}
        assert ids[push.subscription_id] == ids[poll_id] == elsewhere and ids[home_push.subscription_id] == home
        gateway_p1 = await status_of(client.nc, env, "gateway.p1")
        assert gateway_p1 is not None and gateway_p1["partition"] == 1 and gateway_p1["open_subscriptions"] == 2

        await push.close()
        await home_push.close()
        closed = await client.subscription_request("close", {"subscription_id": poll_id})
        assert closed["last_delivered_sequence"] == after[-1]["ledger_sequence"]
        ended = await client.subscription_request("poll", {"subscription_id": poll_id})
        assert ended["closed"] is True and ended["events"] == []
        # Sent straight to partition 1's gateway, a scope of partition 0 is refused, never silently followed.
        with pytest.raises(PamspecError) as refused:
            await _straight(client, f"{env.settings.subject_prefix}.sub.p1.open", home)
        assert refused.value.code == "invalid_request"
    async with await psycopg.AsyncConnection.connect(env.database_url) as conn:
        rows: dict[str, int] = dict(await (await conn.execute("SELECT subscription_id, partition FROM subscriptions")).fetchall())
    assert rows == {push.subscription_id: 1, poll_id: 1, home_push.subscription_id: 0}


async def _straight(client: MemoryClient, subject: str, scope_id: str) -> None:
    reply = await client.nc.request(subject, json.dumps({"scope_id": scope_id, "actor": ACTOR}).encode(), timeout=10)
    body = json.loads(reply.data)
    if "error" in body:
        raise PamspecError.of(body["error"]["code"], body["error"]["message"], body["error"].get("details"))


def start_gateway(env: Env, log_path: Path) -> subprocess.Popen[bytes]:
    environment = service_environment(env, PAMLEDGER_PARTITIONS=str(PARTITIONS),
                                      PAMLEDGER_WRITER__LOCK_POLL_SECONDS="0.2")
    with open(log_path, "ab") as log:
        return subprocess.Popen([sys.executable, "-m", "pamledger", "serve", "--roles", "gateway"], cwd=ROOT,
                                env=environment, stdout=log, stderr=log)


@pytest.fixture
def gateways(env: Env, tmp_path: Path) -> Iterator[list[subprocess.Popen[bytes]]]:
    procs: list[subprocess.Popen[bytes]] = []
    yield procs
    for proc in procs:
        stop_process(proc)


async def test_a_killed_gateway_process_s_partitions_are_taken_over_and_delivery_goes_on(
        env: Env, gateways: list[subprocess.Popen[bytes]], tmp_path: Path) -> None:
    scope_id = scope_in(1, "subtake")
    async with serving(env, ROLES, roles=ROLES) as client:
        client.retries = 6
        await client.create_scope(scope_id)
        gateways.append(start_gateway(env, tmp_path / "gateway0.log"))
        leader = await wait_for(lambda: _leading_both(client.nc, env), timeout=60)
        gateways.append(start_gateway(env, tmp_path / "gateway1.log"))  # the standby
        assert leader == gateways[0].pid
        before = await make(client, scope_id, 3)
        push = await client.subscribe(scope_id, ACTOR, after_sequence=before[0]["ledger_sequence"] - 1,
                                      filter={"event_classes": ["object_created"]},
                                      delivery={"keepalive_interval_ms": 500})
        got: list[dict[str, Any]] = []
        reader = asyncio.create_task(_collect(push, got))  # one iteration throughout, as an application reads
        try:
            await wait_for(lambda: len(got) >= 3, timeout=20)
            # Acknowledged and stored: the gateway that takes over resumes after it.
            await wait_for(lambda: _acknowledged(env, push.subscription_id, before[-1]["ledger_sequence"]),
                           timeout=20)
            os.kill(leader, signal.SIGKILL)
            after = await make(client, scope_id, 3)
            await wait_for(lambda: len(got) >= 6, timeout=60)
        finally:
            reader.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await reader
        assert created(got) == [o["object_id"] for o in before + after]  # every event once, in order
        assert await wait_for(lambda: _leading_both(client.nc, env), timeout=30) == gateways[1].pid
        await push.close()


async def _collect(subscription: Subscription, into: list[dict[str, Any]]) -> None:
    async for event in subscription:
        into.append(event)


async def _leading_both(nc: Any, env: Env) -> int | None:
    """The pid leading both partitions' gateways (None while they are not led by one process)."""
    first, second = await status_of(nc, env, "gateway"), await status_of(nc, env, "gateway.p1")
    if first is None or second is None or first["pid"] != second["pid"]:
        return None
    return int(first["pid"])


async def _acknowledged(env: Env, subscription_id: str, sequence: int) -> bool:
    async with await psycopg.AsyncConnection.connect(env.database_url) as conn:
        cur = await conn.execute("SELECT acked_sequence FROM subscriptions WHERE subscription_id = %s",
                                 (subscription_id,))
        row = await cur.fetchone()
    return row is not None and row[0] == sequence
