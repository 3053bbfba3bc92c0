"""Partitions: two writer processes share four partitions; SIGKILL one, the other takes its partitions over;
each partition's ledger stays gapless and verifies; a changed partition count is refused at start.

The writers run as real subprocesses (`python -m pamledger serve --roles writer`), so a kill is a real kill.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import nats
import psycopg
import pytest

from command_handler.verify import verify_ledger
from infra.partitions import PartitionCountChanged, partition_of, partition_stream, recorded_partitions
from pamledger_client.client import MemoryClient
from tests.conftest import ACTOR, PROVENANCE, Env, Servers, fresh_database, fresh_settings, service_environment, \
    stop_process, wait_for

ROOT = Path(__file__).resolve().parents[2]
PARTITIONS = 4


def scopes_in_every_partition(per_partition: int = 2) -> list[str]:
    """Scope ids, `per_partition` of each partition (the assignment is a hash of the id)."""
    found: dict[int, list[str]] = {p: [] for p in range(PARTITIONS)}
    i = 0
    while any(len(ids) < per_partition for ids in found.values()):
        scope_id = f"workspace:part-{i}"
        ids = found[partition_of(scope_id, PARTITIONS)]
        if len(ids) < per_partition:
            ids.append(scope_id)
        i += 1
    return [s for ids in found.values() for s in ids]


@pytest.fixture(scope="module")
def part_env(servers: Servers) -> Env:
    return Env(servers, fresh_database(servers, "partitions"), fresh_settings("partitions"))


def start_writer(env: Env, log_path: Path) -> subprocess.Popen[bytes]:
    environment = service_environment(env, PAMLEDGER_PARTITIONS=str(PARTITIONS),
                                      PAMLEDGER_WRITER__PARTITION_SHARE=str(PARTITIONS // 2),
                                      PAMLEDGER_WRITER__LOCK_POLL_SECONDS="0.2")
    with open(log_path, "ab") as log:
        return subprocess.Popen([sys.executable, "-m", "pamledger", "serve", "--roles", "writer"], cwd=ROOT,
                                env=environment, stdout=log, stderr=log)


@pytest.fixture(scope="module")
def writers(part_env: Env, tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[subprocess.Popen[bytes]]]:
    logs = tmp_path_factory.mktemp("partitions-logs")
    procs = [start_writer(part_env, logs / f"writer{i}.log") for i in range(2)]
    yield procs
    for proc in procs:
        stop_process(proc)


@pytest.fixture
async def nc(part_env: Env) -> AsyncIterator[Any]:
    conn = await nats.connect(part_env.nats_url)
    yield conn
    await conn.close()


async def leaders(nc: Any, env: Env) -> dict[int, int]:
    """The pid leading each partition's writer (partitions no writer answers for are absent)."""
    found: dict[int, int] = {}
    for partition in range(PARTITIONS):
        try:
            msg = await nc.request(f"{env.settings.subject_prefix}.status.writer.p{partition}", b"{}", timeout=0.5)
        except (nats.errors.TimeoutError, nats.errors.NoRespondersError):
            continue
        found[partition] = int(json.loads(msg.data)["result"]["pid"])
    return found


async def load(client: MemoryClient, scopes: list[str], count: int, acked: dict[str, tuple[str, str]],
               started: asyncio.Event) -> None:
    """`count` creates over the scopes, 16 in flight, each with its own idempotency key; record what was
    acknowledged (key -> scope, version)."""
    queue: asyncio.Queue[int] = asyncio.Queue()
    for i in range(count):
        queue.put_nowait(i)

    async def worker() -> None:
        while not queue.empty():
            i = queue.get_nowait()
            scope_id, key = scopes[i % len(scopes)], f"load:{uuid.uuid4()}"
            result = await client.create(scope_id, "claim", {"n": i}, ACTOR, PROVENANCE, idempotency_key=key)
            acked[key] = (scope_id, result["version_id"])
            if len(acked) >= count // 4:
                started.set()

    await asyncio.gather(*[worker() for _ in range(16)])


async def test_a_killed_writer_process_s_partitions_are_taken_over_gapless_and_verified(
        writers: list[subprocess.Popen[bytes]], part_env: Env, nc: Any) -> None:
    pids = {p.pid for p in writers}
    # Started together with a share of two each, the processes split the four partitions.
    led = await wait_for(lambda: _all_led_by_both(nc, part_env, pids), timeout=60)
    client = await MemoryClient.connect(part_env.nats_url, part_env.settings.subject_prefix, timeout=10.0)
    client.retries = 12
    try:
        scopes = scopes_in_every_partition()
        for scope_id in scopes:
            await client.create_scope(scope_id)
        acked: dict[str, tuple[str, str]] = {}
        started = asyncio.Event()
        loader = asyncio.create_task(load(client, scopes, 1200, acked, started))
        await asyncio.wait_for(started.wait(), timeout=120)
        victim = led[1]  # not the router's process (partition 0), so the router keeps forwarding meanwhile
        os.kill(victim, signal.SIGKILL)
        await asyncio.wait_for(loader, timeout=300)
        survivor = (pids - {victim}).pop()
        assert await wait_for(lambda: _all_led_by(nc, part_env, survivor), timeout=60)
        await client.create(scopes[1], "claim", {"after": "takeover"}, ACTOR, PROVENANCE)
    finally:
        await client.close()
    await assert_partitions_whole(part_env, acked, scopes)
    done = await asyncio.to_thread(
        subprocess.run, [sys.executable, "-m", "pamledger", "verify"], cwd=ROOT, capture_output=True, text=True,
        timeout=120, env=service_environment(part_env, PAMLEDGER_PARTITIONS=str(PARTITIONS)))
    report = json.loads(done.stdout)
    assert done.returncode == 0 and report["ok"], done.stdout + done.stderr
    assert sorted(report["partitions"]) == [str(p) for p in range(PARTITIONS)]
    # audit reads the scope at its own partition's head; replay reads every partition (stream rebuild too:
    # tests/integration/test_partitions_stream.py)
    in_scope = sum(1 for scope_id, _ in acked.values() if scope_id == scopes[3])  # a partition-1 scope
    audited = await asyncio.to_thread(pamledger, part_env, "audit", "--scope", scopes[3])
    assert audited.returncode == 0, audited.stderr
    async with await psycopg.AsyncConnection.connect(part_env.database_url) as conn:
        heads: dict[int, int] = dict(await (await conn.execute(
            "SELECT partition, max(ledger_sequence) FROM ledger GROUP BY partition")).fetchall())
    assert heads[0] != heads[1]  # partition 0 took one more create (after the takeover)
    assert json.loads(audited.stdout)["object_count"] == in_scope
    assert json.loads(audited.stdout)["at_sequence"] == heads[1]
    replayed = await asyncio.to_thread(pamledger, part_env, "replay")  # every partition's events, folded
    assert replayed.returncode == 0, replayed.stderr
    assert json.loads(replayed.stdout)["through_sequence"] == {str(p): heads[p] for p in range(PARTITIONS)}


def pamledger(env: Env, *args: str) -> subprocess.CompletedProcess[str]:
    """`python -m pamledger ARGS` against the module's ledger of PARTITIONS partitions."""
    return subprocess.run([sys.executable, "-m", "pamledger", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=120, env=service_environment(env, PAMLEDGER_PARTITIONS=str(PARTITIONS)))


async def _all_led_by_both(nc: Any, env: Env, pids: set[int]) -> dict[int, int] | None:
    led = await leaders(nc, env)
    return led if len(led) == PARTITIONS and set(led.values()) == pids else None


async def _all_led_by(nc: Any, env: Env, pid: int) -> bool:
    led = await leaders(nc, env)
    return len(led) == PARTITIONS and set(led.values()) == {pid}


async def assert_partitions_whole(env: Env, acked: dict[str, tuple[str, str]], scopes: list[str]) -> None:
    async with await psycopg.AsyncConnection.connect(env.database_url) as conn:
        cur = await conn.execute("SELECT partition, count(*), max(ledger_sequence), count(DISTINCT event_id)"
                                 " FROM ledger GROUP BY partition ORDER BY partition")
        per_partition = await cur.fetchall()
        cur = await conn.execute("SELECT scope_id, partition FROM scopes WHERE scope_id = ANY(%s)", (scopes,))
        recorded: dict[str, int] = dict(await cur.fetchall())
        cur = await conn.execute("SELECT l.scope_id, l.partition FROM ledger l WHERE l.scope_id = ANY(%s)"
                                 " GROUP BY l.scope_id, l.partition", (scopes,))
        written = await cur.fetchall()
        cur = await conn.execute("SELECT idempotency_key, scope_id, version_id FROM idempotency_records"
                                 " WHERE idempotency_key LIKE 'load:%%'")
        keys = {row[0]: (row[1], row[2]) for row in await cur.fetchall()}
    assert [row[0] for row in per_partition] == list(range(PARTITIONS)), "every partition has entries"
    for partition, count, high, events in per_partition:
        assert count == high == events, f"partition {partition} has a gap or a duplicate"
    assert recorded == {s: partition_of(s, PARTITIONS) for s in scopes}, "a scope keeps its hashed partition"
    assert sorted(written) == sorted(recorded.items()), "a scope's entries are all in its partition"
    missing = {k: v for k, v in acked.items() if keys.get(k) != v}
    assert not missing, f"{len(missing)} acknowledged commands are not in the ledger"
    for partition in range(PARTITIONS):
        result = await verify_ledger(env.database_url, env.nats_url,
                                     partition_stream(env.settings.stream_name, partition), partition)
        assert result["ok"], (partition, result)


def test_a_changed_partition_count_is_refused_at_start(servers: Servers, tmp_path: Path) -> None:
    env = Env(servers, fresh_database(servers, "partcount"), fresh_settings("partcount"))
    with psycopg.connect(env.database_url, autocommit=True) as conn:
        assert recorded_partitions(conn, 4) == 4
        with pytest.raises(PartitionCountChanged):
            recorded_partitions(conn, 2)
    done = subprocess.run([sys.executable, "-m", "pamledger", "serve", "--roles", "writer"], cwd=ROOT,
                          env=service_environment(env, PAMLEDGER_PARTITIONS="2"), capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 2
    assert "made with partitions=4" in done.stderr and "partitions=2" in done.stderr


def test_a_ledger_with_rows_before_partitions_counts_one(servers: Servers) -> None:
    env = Env(servers, fresh_database(servers, "partold"), fresh_settings("partold"))
    with psycopg.connect(env.database_url, autocommit=True) as conn:
        conn.execute("INSERT INTO ledger (ledger_sequence, event_id, operation_id, scope_id, event_type,"
                     " recorded_at, event, prev_hash, row_hash) VALUES (1, 'e1', 'o1', 's', 't', now(), '', '', '')")
        with pytest.raises(PartitionCountChanged):
            recorded_partitions(conn, 4)
        assert recorded_partitions(conn, 1) == 1


async def test_each_partition_is_projected_on_its_own_checkpoint_and_queries_see_their_own_writes(
        servers: Servers) -> None:
    from tests.conftest import serving

    env = Env(servers, fresh_database(servers, "partquery"), fresh_settings("partquery", partitions=PARTITIONS))
    scopes = scopes_in_every_partition(1)
    roles = ("writer", "query", "projector", "gateway")
    async with serving(env, roles, roles=roles) as client:
        client.retries = 3
        for scope_id in scopes:
            await client.create_scope(scope_id)
        # Each partition has its gateway: a scope of any partition is subscribed to (test_subscribe_partitions).
        for scope_id in scopes[:2]:
            subscription = await client.subscribe(scope_id, ACTOR)
            await subscription.close()
        written: dict[str, list[str]] = {s: [] for s in scopes}
        for round_ in range(3):
            for scope_id in scopes:  # each write, then at once a query of the scope: it sees the write
                created = await client.create(scope_id, "claim", {"round": round_}, ACTOR, PROVENANCE)
                written[scope_id].append(created["object_id"])
                found = await client.query(scope_id, wait_ms=10_000, validation_states=["unverified"])
                assert found["min_sequence_reached"], found
                assert sorted(i["envelope"]["object_id"] for i in found["items"]) == sorted(written[scope_id]), \
                    (round_, scope_id, partition_of(scope_id, PARTITIONS), created, found)
                assert found["as_of_sequence"] >= created["ledger_sequence"]
    async with await psycopg.AsyncConnection.connect(env.database_url) as conn:
        cur = await conn.execute("SELECT partition, max(ledger_sequence) FROM ledger GROUP BY partition")
        heads: dict[int, int] = dict(await cur.fetchall())
        cur = await conn.execute("SELECT projection, ledger_sequence FROM projection_checkpoints")
        checkpoints: dict[str, int] = dict(await cur.fetchall())
    assert sorted(heads) == list(range(PARTITIONS))
    # Each partition's checkpoint is its own: partition 0's keeps the one-partition name.
    assert checkpoints == {("current_objects" if p == 0 else f"current_objects.p{p}"): heads[p]
                           for p in range(PARTITIONS)}


async def test_a_router_that_cannot_read_the_scopes_answers_service_unavailable(part_env: Env, nc: Any) -> None:
    """Its connection gone, the router answers the batch it could not route (retryable), never drops it."""
    from command_handler.router import Router

    prefix = f"{part_env.settings.subject_prefix}_router"
    router_nc = await nats_raw_connect(part_env.nats_url)
    conn = await psycopg.AsyncConnection.connect(part_env.database_url, autocommit=True)
    await conn.close()  # what a database that went away leaves: every statement fails
    router = Router(router_nc, conn, prefix, PARTITIONS, {})
    task = asyncio.create_task(router.serve())
    try:
        reply = await wait_for(lambda: _answer(nc, f"{prefix}.cmd.create", b'{"scope_id": "workspace:nowhere"}',
                                               {"Pam-Operation-Id": "op:router-test"}), timeout=20)
        body = json.loads(reply.data)
        assert body["error"]["code"] == "service_unavailable" and body["error"]["retryable"] is True
        assert body["error"]["operation_id"] == "op:router-test"
        with pytest.raises(psycopg.OperationalError):
            await asyncio.wait_for(task, timeout=10)
    finally:
        task.cancel()
        with contextlib.suppress(BaseException):
            await task
        await router_nc.close()


async def nats_raw_connect(url: str) -> Any:
    from infra.nats_raw import connect_raw

    return await connect_raw(url)


async def _answer(nc: Any, subject: str, data: bytes, headers: dict[str, str]) -> Any:
    """The reply, None while nobody listens on the subject yet."""
    try:
        return await nc.request(subject, data, timeout=10, headers=headers)
    except nats.errors.NoRespondersError:
        return None
