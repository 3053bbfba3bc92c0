"""Followers and gateways split the partitions between processes as writers do (`writer.partition_share`): two
`serve --roles projector,gateway` processes started together with a share of one each lead one partition
apiece, a scope's reads and Subscribe go through whichever process leads its partition, and when one process
is SIGKILLed the other takes its partition over: reads see every write, the push subscription gets every
event once, in order.

The processes are real subprocesses (`python -m pamledger serve`), so a kill is a real kill.
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
import pytest

from infra.partitions import partition_of
from pamledger_client.client import MemoryClient
from pamledger_client.subscription import Subscription
from tests.conftest import ACTOR, PROVENANCE, Env, Servers, fresh_database, fresh_settings, service_environment, \
    serving, stop_process, wait_for

ROOT = Path(__file__).resolve().parents[2]
PARTITIONS = 2
SHARED = ("projector", "gateway")  # the roles the two processes split


def scope_in(partition: int, label: str) -> str:
    return next(s for i in range(1000) if partition_of(s := f"workspace:{label}-{i}", PARTITIONS) == partition)


@pytest.fixture(scope="module")
def env(servers: Servers) -> Env:
    return Env(servers, fresh_database(servers, "partshare"), fresh_settings("partshare", partitions=PARTITIONS))


@pytest.fixture
def processes(env: Env, tmp_path: Path) -> Iterator[list[subprocess.Popen[bytes]]]:
    environment = service_environment(env, PAMLEDGER_WRITER__PARTITION_SHARE="1",
                                      PAMLEDGER_WRITER__LOCK_POLL_SECONDS="0.2")
    procs = []
    for i in range(2):
        with open(tmp_path / f"serve{i}.log", "ab") as log:
            procs.append(subprocess.Popen([sys.executable, "-m", "pamledger", "serve", "--roles", ",".join(SHARED)],
                                          cwd=ROOT, env=environment, stdout=log, stderr=log))
    yield procs
    for proc in procs:
        stop_process(proc)


async def leader(nc: Any, env: Env, role: str, partition: int) -> int | None:
    """The pid leading `role` in `partition` (None while none answers)."""
    subject = f"{env.settings.subject_prefix}.status.{role}" + ("" if partition == 0 else f".p{partition}")
    try:
        msg = await nc.request(subject, b"{}", timeout=1)
    except (nats.errors.TimeoutError, nats.errors.NoRespondersError):
        return None
    return int(json.loads(msg.data)["result"]["pid"])


async def leaders(nc: Any, env: Env) -> dict[tuple[str, int], int | None]:
    return {(role, p): await leader(nc, env, role, p) for role in SHARED for p in range(PARTITIONS)}


async def split(nc: Any, env: Env, pids: set[int]) -> dict[tuple[str, int], int | None] | None:
    """Each role's partitions led by the two processes, one apiece (None until so)."""
    found = await leaders(nc, env)
    each = all({found[(role, p)] for p in range(PARTITIONS)} == pids for role in SHARED)
    return found if each else None


async def led_by(nc: Any, env: Env, pid: int) -> bool:
    return set((await leaders(nc, env)).values()) == {pid}


async def collect(subscription: Subscription, into: list[dict[str, Any]]) -> None:
    async for event in subscription:
        into.append(event)


async def make(client: MemoryClient, scope_id: str, count: int) -> list[dict[str, Any]]:
    return [await client.create(scope_id, "claim", {"n": i}, ACTOR, PROVENANCE) for i in range(count)]


async def readable(client: MemoryClient, scope_id: str, made: list[dict[str, Any]]) -> None:
    """Every write reads back (read-your-writes: the query waits for the projector of the scope's partition)."""
    for obj in made:
        assert (await client.read(scope_id, obj["object_id"]))["version_id"] == obj["version_id"]


async def test_two_processes_split_the_followers_and_gateways_and_one_takes_over_the_other_s(
        env: Env, processes: list[subprocess.Popen[bytes]]) -> None:
    scopes = [scope_in(p, "share") for p in range(PARTITIONS)]
    async with serving(env, ("writer", "query"), roles=("writer", "query")) as client:
        client.retries = 6
        pids = {p.pid for p in processes}
        found = await wait_for(lambda: split(client.nc, env, pids), timeout=60)
        for scope_id in scopes:
            await client.create_scope(scope_id)
        # A push subscription on the scope whose gateway is in the process that will be killed.
        victim = found[("gateway", 1)]
        assert victim is not None
        pushes = {s: await client.subscribe(s, ACTOR, filter={"event_classes": ["object_created"]},
                                            delivery={"keepalive_interval_ms": 500}) for s in scopes}
        got: dict[str, list[dict[str, Any]]] = {s: [] for s in scopes}
        readers = [asyncio.create_task(collect(pushes[s], got[s])) for s in scopes]
        try:
            before = {s: await make(client, s, 3) for s in scopes}
            for s in scopes:
                await readable(client, s, before[s])
            await wait_for(lambda: all(len(got[s]) >= 3 for s in scopes), timeout=30)
            os.kill(victim, signal.SIGKILL)
            survivor = (pids - {victim}).pop()
            after = {s: await make(client, s, 3) for s in scopes}
            for s in scopes:
                await readable(client, s, after[s])
            await wait_for(lambda: all(len(got[s]) >= 6 for s in scopes), timeout=60)
            assert await wait_for(lambda: led_by(client.nc, env, survivor), timeout=30)
        finally:
            for task in readers:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        for s in scopes:  # every event once, in order
            assert [e["event"]["object_id"] for e in got[s]] == [o["object_id"] for o in before[s] + after[s]]
            await pushes[s].close()
