"""Crashes under load: SIGKILL the leading writer, fail over to the standby, lose the stream, restart NATS.

Service instances run as real subprocesses (`python -m pamledger run`), so a kill is a real kill.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

from command_handler.verify import verify_ledger
from pamledger_client.client import MemoryClient, PamspecError
from pamledger.supervisor import ROLES as ALL_ROLES
from tests.conftest import service_environment, ACTOR, PROVENANCE, Env, Servers, fresh_database, fresh_settings, wait_for
from tests.integration.test_writer import assert_stream_equals_ledger

SCOPE = "workspace:faults"
ROOT = Path(__file__).resolve().parents[2]


class ServiceProcess:
    """One `pamledger run` (a supervisor and a process per role) against the module's servers."""

    def __init__(self, env: Env, log_path: Path):
        environment = service_environment(env, PAMLEDGER_WRITER__LOCK_POLL_SECONDS="0.2")
        self.log = open(log_path, "ab")
        self.proc = subprocess.Popen([sys.executable, "-m", "pamledger", "run"], cwd=ROOT, env=environment,
                                     stdout=self.log, stderr=self.log)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()


@pytest.fixture(scope="module")
def nats_private(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """A NATS of this module's own, so restarting it disturbs no other module."""
    from local_servers.launch import start_nats

    server = start_nats(tmp_path_factory.mktemp("faults-nats"))
    yield server
    server.stop()


@pytest.fixture(scope="module")
def fault_env(servers: Servers, nats_private: Any) -> Env:
    return Env(Servers(nats_private.url, servers.admin_url), fresh_database(servers, "faults"),
               fresh_settings("faults"))


@pytest.fixture(scope="module")
async def pair(fault_env: Env, tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[list[ServiceProcess]]:
    logs = tmp_path_factory.mktemp("faults-logs")
    procs = [ServiceProcess(fault_env, logs / f"service{i}.log") for i in range(2)]
    client = await connect(fault_env)
    await wait_for(lambda: leader_pid(client), timeout=60)
    await client.create_scope(SCOPE)
    await client.close()
    yield procs
    for p in procs:
        p.stop()


async def connect(env: Env) -> MemoryClient:
    client = await MemoryClient.connect(env.nats_url, env.settings.subject_prefix, timeout=10.0)
    client.retries = 12
    return client


async def leader_pid(client: MemoryClient, role: str = "writer") -> int | None:
    """The pid of the process leading `role` (writer, projector or gateway), None while none answers."""
    retries, client.retries = client.retries, 0
    try:
        return int((await client.status(role))["pid"])
    except PamspecError:
        return None
    finally:
        client.retries = retries


async def load(client: MemoryClient, count: int, acked: dict[str, str], started: asyncio.Event) -> None:
    """`count` creates, 16 in flight, each with its own idempotency key; record what was acknowledged."""
    queue: asyncio.Queue[int] = asyncio.Queue()
    for i in range(count):
        queue.put_nowait(i)

    async def worker() -> None:
        while not queue.empty():
            i = queue.get_nowait()
            key = f"load:{uuid.uuid4()}"
            result = await client.create(SCOPE, "claim", {"n": i}, ACTOR, PROVENANCE, idempotency_key=key)
            acked[key] = result["version_id"]
            if len(acked) >= count // 4:
                started.set()

    await asyncio.gather(*[worker() for _ in range(16)])


async def assert_ledger_whole(env: Env, acked: dict[str, str]) -> None:
    async with await psycopg.AsyncConnection.connect(env.database_url) as conn:
        cur = await conn.execute("SELECT count(*), coalesce(max(ledger_sequence), 0), count(DISTINCT event_id),"
                                 " count(DISTINCT version_id) FROM ledger")
        count, high, events, versions = await cur.fetchone()  # type: ignore[misc]
        assert count == high == events, "ledger has a gap or a duplicate"
        cur = await conn.execute("SELECT idempotency_key, version_id FROM idempotency_records"
                                 " WHERE idempotency_key LIKE 'load:%%'")
        recorded = dict(await cur.fetchall())
    missing = {k: v for k, v in acked.items() if recorded.get(k) != v}
    assert not missing, f"{len(missing)} acknowledged commands are not in the ledger"
    assert (await verify_ledger(env.database_url, env.nats_url, env.settings.stream_name))["ok"]


async def test_sigkill_of_the_leader_loses_no_acknowledged_command(pair: list[ServiceProcess],
                                                                    fault_env: Env) -> None:
    client = await connect(fault_env)
    pid = await wait_for(lambda: leader_pid(client), timeout=30)
    acked: dict[str, str] = {}
    started = asyncio.Event()
    loader = asyncio.create_task(load(client, 1200, acked, started))
    await asyncio.wait_for(started.wait(), timeout=120)
    os.kill(pid, signal.SIGKILL)
    await asyncio.wait_for(loader, timeout=300)
    new_pid = await wait_for(lambda: leader_pid(client), timeout=60)
    assert new_pid != pid
    await assert_ledger_whole(fault_env, acked)
    await assert_stream_equals_ledger(client.nc, fault_env)
    await client.close()


async def test_promote_is_atomic_under_a_writer_sigkill(pair: list[ServiceProcess], fault_env: Env) -> None:
    """[M5] Promotions in flight when the leading writer is SIGKILLed: each one is all four entries (the new
    object, the source superseded, the derived_from relationship, working_memory_promoted), consecutive in the
    ledger under one operation, or none of them; every acknowledged one is there."""
    client = await connect(fault_env)
    pid = await wait_for(lambda: leader_pid(client), timeout=30)
    sources = [await client.create(SCOPE, "working_memory", {"task_ref": "task:kill", "content": {"i": i}},
                                   ACTOR, PROVENANCE) for i in range(160)]
    acked: dict[str, str] = {}
    started = asyncio.Event()
    queue: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
    for source in sources:
        queue.put_nowait(source)

    async def worker() -> None:
        while not queue.empty():
            source = queue.get_nowait()
            try:
                result = await client.command("promote", {
                    "scope_id": SCOPE, "source_object_id": source["object_id"],
                    "expected_version_id": source["version_id"], "target_object_type": "claim",
                    "target_canonical_content": {"statement": f"from {source['object_id']}"},
                    "actor": ACTOR, "provenance": PROVENANCE, "idempotency_key": f"promote:{source['object_id']}"})
            except PamspecError as exc:  # a retry after a commit whose reply was lost meets the moved source
                assert exc.code in ("version_conflict", "invalid_state_transition", "service_unavailable"), exc
                continue
            acked[source["object_id"]] = result["object_id"]
            if len(acked) >= 20:
                started.set()

    loader = asyncio.gather(*[worker() for _ in range(16)])
    await asyncio.wait_for(started.wait(), timeout=120)
    os.kill(pid, signal.SIGKILL)
    await asyncio.wait_for(loader, timeout=300)
    assert await wait_for(lambda: leader_pid(client), timeout=60) != pid
    async with await psycopg.AsyncConnection.connect(fault_env.database_url) as conn:
        rows = await (await conn.execute(
            "SELECT ledger_sequence, operation_id, event_type, object_id FROM ledger WHERE operation_id IN"
            " (SELECT operation_id FROM ledger WHERE event_type = 'working_memory_promoted') ORDER BY ledger_sequence"
        )).fetchall()
        superseded = {r[0] for r in await (await conn.execute(
            "SELECT object_id FROM current_objects WHERE scope_id = %s AND object_type = 'working_memory'"
            " AND lifecycle_state = 'superseded'", (SCOPE,))).fetchall()}
    by_operation: dict[str, list[tuple[int, str, str]]] = {}
    for seq, operation, event_type, object_id in rows:
        by_operation.setdefault(operation, []).append((seq, event_type, object_id))
    promoted_sources = set()
    for entries in by_operation.values():
        assert [e[1] for e in entries] == ["object_created", "lifecycle_transitioned", "relationship_created",
                                           "working_memory_promoted"], entries
        assert [e[0] for e in entries] == list(range(entries[0][0], entries[0][0] + 4)), "not consecutive"
        promoted_sources.add(entries[1][2])
    assert len(promoted_sources) == len(by_operation), "a source was promoted twice"
    assert set(acked) <= promoted_sources, "an acknowledged promotion is missing"

    async def projected() -> bool:
        async with await psycopg.AsyncConnection.connect(fault_env.database_url) as conn:
            rows = await (await conn.execute(
                "SELECT object_id FROM current_objects WHERE scope_id = %s AND object_type = 'working_memory'"
                " AND lifecycle_state = 'superseded'", (SCOPE,))).fetchall()
        return {r[0] for r in rows} == promoted_sources
    assert superseded <= promoted_sources
    await wait_for(projected, timeout=60, interval=0.2)
    await assert_stream_equals_ledger(client.nc, fault_env)
    report = await verify_ledger(fault_env.database_url, fault_env.nats_url, fault_env.settings.stream_name)
    assert report["ok"], report
    await client.close()


async def test_a_lost_stream_is_rebuilt_from_the_ledger(pair: list[ServiceProcess], fault_env: Env) -> None:
    client = await connect(fault_env)
    await client.nc.jetstream().delete_stream(fault_env.settings.stream_name)
    created = await client.create(SCOPE, "claim", {"after": "stream loss"}, ACTOR, PROVENANCE)
    await assert_stream_equals_ledger(client.nc, fault_env)

    async def projected() -> bool:  # the projector's consumer went with the stream: it must notice
        items = (await client.query(SCOPE, min_sequence=0, validation_states=["unverified"]))["items"]
        return created["object_id"] in {item["envelope"]["object_id"] for item in items}
    await wait_for(projected, timeout=60, interval=0.2)
    await client.close()


async def test_the_service_rides_out_a_nats_restart(pair: list[ServiceProcess], fault_env: Env,
                                                    nats_private: Any) -> None:
    nats_private.kill()
    nats_private.restart()
    client = await connect(fault_env)
    await wait_for(lambda: leader_pid(client), timeout=60)
    created = await client.create(SCOPE, "claim", {"after": "nats restart"}, ACTOR, PROVENANCE)
    assert (await client.read(SCOPE, created["object_id"]))["canonical_content"] == {"after": "nats restart"}
    await assert_stream_equals_ledger(client.nc, fault_env)
    await client.close()


def role_children(supervisor_pid: int) -> dict[str, int]:
    """{role: pid} of the `serve --roles R` children of one `pamledger run` supervisor (from /proc)."""
    found: dict[str, int] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            argv = (entry / "cmdline").read_bytes().split(b"\0")
        except (OSError, IndexError, ValueError):
            continue
        if ppid == supervisor_pid and b"--roles" in argv:
            found[argv[argv.index(b"--roles") + 1].decode()] = int(entry.name)
    return found


async def test_the_supervisor_restarts_a_role_process_that_dies(pair: list[ServiceProcess],
                                                               fault_env: Env) -> None:
    supervisor = pair[0].proc.pid
    before = await wait_for(lambda: len(role_children(supervisor)) == len(ALL_ROLES) and role_children(supervisor),
                            timeout=30)
    assert set(before) == set(ALL_ROLES)  # writer, query, projector, indexer, gateway
    os.kill(before["query"], signal.SIGKILL)
    after = await wait_for(lambda: (c := role_children(supervisor)).get("query") not in (None, before["query"])
                           and c, timeout=60)
    assert {role: pid for role, pid in after.items() if role != "query"} == \
        {role: pid for role, pid in before.items() if role != "query"}, "only the dead child is replaced"
    client = await connect(fault_env)
    created = await client.create(SCOPE, "claim", {"after": "query restart"}, ACTOR, PROVENANCE)
    assert (await client.read(SCOPE, created["object_id"]))["canonical_content"] == {"after": "query restart"}
    await client.close()
