"""A JetStream cluster survives a node: SIGKILL the stream leader's node under load.

One `pamledger run` (a supervisor and a process per role) against a 3-node cluster of the module's own,
given every node's URL; the ledger stream is R3. While creates flow and a push and a poll subscription
read, the node that leads the stream is SIGKILLed, and after a while restarted on its port and store.
Nothing acknowledged is lost, writes go on after a pause of seconds, no role process restarts, both
subscriptions see every event exactly once in order, the projector and the indexer catch up, and the
restarted node catches up with the stream.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

from embedding.store import INDEX_CHECKPOINT
from local_servers.nats_cluster import cluster_url
from local_servers.nats_server import NatsServer
from pamledger_client.client import MemoryClient, PamspecError
from tests.conftest import ACTOR, PROVENANCE, Env, Servers, fresh_database, fresh_settings, nats_cluster, wait_for
from tests.integration.test_faults import ServiceProcess, assert_ledger_whole, leader_pid
from tests.integration.test_writer import assert_stream_equals_ledger

SCOPE = "workspace:cluster"
TOTAL = 360  # creates; the leader's node dies after a third of them
WORKERS = 8
ROLES_WITH_STATUS = ("writer", "projector", "indexer", "gateway")
# A command in flight to the writer when the writer's node dies is lost with it: its client retries (same
# idempotency key) once its request timeout passes. The clients here wait 3 s (PAMLEDGER_REQUEST_TIMEOUT_SECONDS;
# the default 10 s would pause such a command 10 s). Beyond that acknowledgements may pause only while
# connections move to another node: the bound leaves a loaded 2-core CI box room, and fails a writer that
# waits on the stream (its election takes seconds) before it acknowledges.
REQUEST_TIMEOUT_SECONDS = 3.0
MAX_ACK_PAUSE_SECONDS = REQUEST_TIMEOUT_SECONDS + 3.0


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[NatsServer]]:
    with nats_cluster(tmp_path_factory.mktemp("cluster-nats")) as nodes:
        yield nodes


@pytest.fixture(scope="module")
def cluster_env(servers: Servers, cluster: list[NatsServer]) -> Env:
    return Env(Servers(cluster_url(cluster), servers.admin_url), fresh_database(servers, "cluster"),
               fresh_settings("cluster"))


@pytest.fixture(scope="module")
async def service(cluster_env: Env, tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[ServiceProcess]:
    proc = ServiceProcess(cluster_env, tmp_path_factory.mktemp("cluster-logs") / "service.log")
    client = await connect(cluster_env)
    await wait_for(lambda: leader_pid(client), timeout=60)
    await client.create_scope(SCOPE)
    await client.close()
    yield proc
    proc.stop()


async def connect(env: Env) -> MemoryClient:
    client = await MemoryClient.connect(env.nats_url, env.settings.subject_prefix, timeout=REQUEST_TIMEOUT_SECONDS)
    client.retries = 12
    return client


async def stream_leader(client: MemoryClient, env: Env, cluster: list[NatsServer]) -> NatsServer:
    """The node whose server leads the ledger stream (R3: there is one once the stream has a quorum)."""
    info = await client.nc.jetstream().stream_info(env.settings.stream_name)
    assert info.config.num_replicas == 3, "the ledger stream of a 3-node cluster is not R3"
    assert info.cluster is not None and info.cluster.leader
    return next(node for node in cluster
                if node.cluster is not None and node.cluster.server_name == info.cluster.leader)


async def caught_up_everywhere(client: MemoryClient, env: Env) -> bool:
    """Every replica of the stream is current, none offline, none lagging."""
    try:
        info = await client.nc.jetstream().stream_info(env.settings.stream_name)
    except Exception:  # noqa: BLE001 - an election in progress: ask again
        return False
    replicas = (info.cluster.replicas or []) if info.cluster is not None else []
    return len(replicas) == 2 and all(r.current and not r.offline and not r.lag for r in replicas)


async def write(client: MemoryClient, count: int, acked: dict[str, str], times: list[float]) -> None:
    """`count` creates, WORKERS in flight, each with its own key (retried by the SDK under that key)."""
    queue: asyncio.Queue[int] = asyncio.Queue()
    for i in range(count):
        queue.put_nowait(i)

    async def worker() -> None:
        while not queue.empty():
            i = queue.get_nowait()
            key = f"load:{uuid.uuid4()}"
            while True:
                try:
                    result = await client.create(SCOPE, "claim", {"n": i}, ACTOR, PROVENANCE, idempotency_key=key)
                    break
                except PamspecError as exc:
                    assert exc.retryable, exc
            acked[key] = result["version_id"]
            times.append(time.monotonic())

    await asyncio.gather(*[worker() for _ in range(WORKERS)])


async def read_push(client: MemoryClient, seen: list[int], until: asyncio.Event) -> None:
    sub = await client.subscribe(SCOPE, ACTOR, after_sequence=0, filter={"event_classes": ["object_created"]},
                                 delivery={"keepalive_interval_ms": 500})
    async for event in sub:
        seen.append(event["ledger_sequence"])
        if until.is_set() and len(seen) >= TOTAL:
            break
    await sub.close()


async def read_poll(client: MemoryClient, seen: list[int], until: asyncio.Event) -> None:
    """A poll subscription: each poll acknowledges what it returns, so a poll whose answer was lost with
    the node is followed by a resume after the last event received (what a poll client does)."""
    opened = await client.subscription_request("open", {
        "scope_id": SCOPE, "actor": ACTOR, "after_sequence": 0, "filter": {"event_classes": ["object_created"]},
        "delivery": {"mode": "poll"}, "operation_id": f"op:{uuid.uuid4()}"})
    subscription_id = opened["subscription_id"]
    idle = 0
    while not (until.is_set() and len(seen) >= TOTAL):
        try:
            polled = await client.subscription_request("poll", {"subscription_id": subscription_id,
                                                                "max_events": 50, "wait_ms": 200})
        except PamspecError as exc:
            assert exc.retryable, exc
            await client.subscription_request("resume", {"subscription_id": subscription_id,
                                                         "after_sequence": seen[-1] if seen else 0})
            continue
        seen.extend(event["ledger_sequence"] for event in polled["events"])
        if until.is_set() and not polled["events"]:
            idle += 1
            if idle == 50:
                status = await client.subscription_request("status", {"subscription_id": subscription_id})
                raise AssertionError(f"poll stalled at {len(seen)} events: {status}")


async def test_killing_the_stream_leaders_node_under_load_loses_nothing_and_restarts_no_role(
        service: ServiceProcess, cluster_env: Env, cluster: list[NatsServer]) -> None:
    client = await connect(cluster_env)
    pids = {role: await wait_for(lambda role=role: leader_pid(client, role), timeout=60) for role in ROLES_WITH_STATUS}
    acked: dict[str, str] = {}
    times: list[float] = []
    pushed: list[int] = []
    polled: list[int] = []
    written = asyncio.Event()
    readers = [asyncio.create_task(read_push(await connect(cluster_env), pushed, written)),
               asyncio.create_task(read_poll(await connect(cluster_env), polled, written))]
    writer = asyncio.create_task(write(client, TOTAL, acked, times))
    await wait_for(lambda: len(acked) >= TOTAL // 3, timeout=60)

    victim = await stream_leader(client, cluster_env, cluster)
    killed_at = time.monotonic()
    victim.kill()
    await wait_for(lambda: len(acked) >= 2 * TOTAL // 3, timeout=60)  # acknowledging with the node away
    victim.restart()  # its port and store: it rejoins and catches up
    await asyncio.wait_for(writer, timeout=120)
    written.set()
    await asyncio.wait_for(asyncio.gather(*readers), timeout=60)

    pauses = [later - earlier for earlier, later in zip(times, times[1:]) if later > killed_at]
    assert max(pauses) < MAX_ACK_PAUSE_SECONDS, f"writes paused {max(pauses):.1f}s after the kill"
    await assert_ledger_whole(cluster_env, acked)
    await assert_stream_equals_ledger(client.nc, cluster_env)
    creates = await ledger_creates(cluster_env)
    assert pushed == creates, "the push subscription missed, repeated or reordered an event"
    assert polled == creates, "the poll subscription missed, repeated or reordered an event"
    head = creates[-1]
    await wait_for(lambda: projected_through(client, head), timeout=30)
    await wait_for(lambda: indexed_through(cluster_env, head), timeout=30)
    await wait_for(lambda: caught_up_everywhere(client, cluster_env), timeout=30, interval=0.2)
    for role, pid in pids.items():
        assert await leader_pid(client, role) == pid, f"the {role} process was restarted"
    assert b"supervisor.child_exited" not in Path(service.log.name).read_bytes(), "a role process exited"
    await client.close()


async def ledger_creates(env: Env) -> list[int]:
    """The ledger sequences of the scope's object_created events, in order."""
    async with await psycopg.AsyncConnection.connect(env.database_url) as conn:
        cur = await conn.execute("SELECT ledger_sequence FROM ledger WHERE scope_id = %s"
                                 " AND event_type = 'object_created' ORDER BY ledger_sequence", (SCOPE,))
        return [int(row[0]) for row in await cur.fetchall()]


async def indexed_through(env: Env, sequence: int) -> bool:
    async with await psycopg.AsyncConnection.connect(env.database_url) as conn:
        cur = await conn.execute("SELECT ledger_sequence FROM projection_checkpoints WHERE projection = %s",
                                 (INDEX_CHECKPOINT,))
        row = await cur.fetchone()
    return row is not None and int(row[0]) >= sequence


async def projected_through(client: MemoryClient, sequence: int) -> bool:
    return int((await client.query(SCOPE, min_sequence=0, limit=1))["as_of_sequence"]) >= sequence
