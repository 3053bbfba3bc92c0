"""The NATS-driven scenarios: (a) pamledger, (b) naive writer, (c) echo, (e) writer memory.

Each scenario gets a fresh database (migrated), its own subject prefix and stream name, its service in a
separate process, and cleans all of that up when it ends, whether it succeeded or not.
"""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

import msgspec
import nats
from nats.aio.client import Client as NATS
import psutil  # type: ignore[import-untyped]
import psycopg

from bench.load import (
    INSERT_SCOPE_SQL, SCOPE_ID, Result, check_echo, check_result, create_requests, create_scope, drive, drive_count,
)
from bench.procs import Child, python_child, tree_cpu, wait_answering
from bench.servers import Servers
from bench.service import echo_service, service_process
from infra.subjects import command_subject, status_subject


@dataclass(frozen=True)
class Config:
    duration: float
    warmup: float
    in_flight: int = 64
    mem_creates: int = 100_000
    es_threads: int = 16


def _tag() -> str:
    return uuid.uuid4().hex[:8]


async def _connect(url: str) -> NATS:
    return await nats.connect(url, name="pamledger-bench", pending_size=64 * 1024 * 1024,
                              max_reconnect_attempts=0, connect_timeout=5)


@contextlib.asynccontextmanager
async def pamledger_service(servers: Servers, label: str, extra_env: dict[str, str] | None = None,
                            ) -> AsyncIterator[tuple[NATS, str, Child]]:
    """The real service on a fresh database with the bench scope created; the database is dropped after."""
    db_name, db_url = servers.fresh_database(label)
    try:
        async with service_process(servers, db_url, label, extra_env) as (nc, prefix, _stream, child):
            await create_scope(nc, prefix)
            yield nc, prefix, child
    finally:
        servers.drop_database(db_name)


async def writer_status(nc: NATS, prefix: str) -> dict[str, Any]:
    msg = await nc.request(status_subject(prefix, "writer"), b"{}", timeout=5)
    return msgspec.json.decode(msg.data)["result"]  # type: ignore[no-any-return]


async def scenario_a(servers: Servers, cfg: Config) -> dict[str, Result]:
    """pamledger creates through NATS: 64 in flight, then 1 in flight on a second fresh service and database.

    The serial run gets its own service so that no backlog left by the loaded run (relay, projections)
    competes with it.
    """
    async with pamledger_service(servers, "a") as (nc, prefix, child):
        cpu0, others0 = child.cpu_by_process(), other_cpu(servers)
        fast = await _creates(nc, prefix, "(a) pamledger create", cfg.in_flight, cfg)
        cpu1, others1 = child.cpu_by_process(), other_cpu(servers)
        per_create = {k: round((v - cpu0.get(k, 0.0)) / fast.extra["sent"] * 1e6) for k, v in cpu1.items()}
        fast.extra["service_cpu_us_per_create"] = sum(per_create.values())
        fast.extra["service_cpu_us_per_create_by_process"] = per_create
        fast.extra["other_cpu_us_per_create"] = {
            k: round((v - others0[k]) / fast.extra["sent"] * 1e6) for k, v in others1.items()}
    async with pamledger_service(servers, "as") as (nc, prefix, child):
        serial = await _creates(nc, prefix, "(a) pamledger create, serial", 1, cfg)
    return {"a": fast, "a_serial": serial}


def other_cpu(servers: Servers) -> dict[str, float]:
    """CPU seconds so far of what (a) needs besides the service: the servers (when private) and this
    process, the load driver."""
    out = {name: sum(tree_cpu(pid).values()) for name, pid in servers.server_pids.items()}
    own = psutil.Process().cpu_times()
    out["bench driver"] = own.user + own.system
    return out


async def _creates(nc: NATS, prefix: str, name: str, in_flight: int, cfg: Config) -> Result:
    """Drive creates, then check the ledger holds at least every success counted."""
    result = await drive(nc, command_subject(prefix, "create"), name, create_requests(_tag()), check_result,
                         in_flight, cfg.warmup, cfg.duration)
    status = await writer_status(nc, prefix)
    if status["ledger_sequence"] < result.ok:
        raise RuntimeError(f"ledger has {status['ledger_sequence']} rows, fewer than the {result.ok} successes")
    result.extra["ledger_sequence_at_end"] = status["ledger_sequence"]
    return result


async def scenario_b(servers: Servers, cfg: Config) -> dict[str, Result]:
    """The naive one-transaction-per-command writer, same load as (a)."""
    db_name, db_url = servers.fresh_database("b")
    with psycopg.connect(db_url, autocommit=True) as conn:
        conn.execute(INSERT_SCOPE_SQL, (SCOPE_ID,))
    subject = f"bench_b_{_tag()}.create"
    child = python_child("naive-b", "bench.naive", {}, servers.work_dir, servers.nats_url, db_url, subject)
    nc = await _connect(servers.nats_url)
    try:
        child.start()
        await wait_answering(nc, child, subject + ".ping")
        cpu0 = child.cpu_seconds()
        result = await drive(nc, subject, "(b) naive writer create", create_requests(_tag()), check_result,
                             cfg.in_flight, cfg.warmup, cfg.duration)
        result.extra["service_cpu_us_per_create"] = round((child.cpu_seconds() - cpu0) / result.extra["sent"] * 1e6)
        if not child.alive():
            raise RuntimeError(f"naive writer died:\n{child.log_tail()}")
    finally:
        child.stop()
        await nc.close()
        servers.drop_database(db_name)
    return {"b": result}


async def scenario_c(servers: Servers, cfg: Config) -> dict[str, Result]:
    """The NATS echo service: same payloads and headers, 64 in flight, then 1 in flight."""
    async with echo_service(servers, "c") as (nc, subject):
        fast = await drive(nc, subject, "(c) NATS echo", create_requests(_tag()), check_echo,
                           cfg.in_flight, cfg.warmup, cfg.duration)
        serial = await drive(nc, subject, "(c) NATS echo, serial", create_requests(_tag()), check_echo,
                             1, cfg.warmup, cfg.duration)
    return {"c": fast, "c_serial": serial}


def _rss_probe(out: dict[int, int], percent: int, writer: psutil.Process) -> Callable[[], None]:
    return lambda: out.__setitem__(percent, int(writer.memory_info().rss))


async def scenario_e(servers: Servers, cfg: Config) -> dict[str, Result]:
    """N creates of distinct objects with a 1000-entry head cache; the writer process's RSS at each tenth
    of the run (the writer is the process answering `status.writer`)."""
    total = cfg.mem_creates
    rss: dict[int, int] = {}
    async with pamledger_service(servers, "e", {"PAMLEDGER_WRITER__HEAD_CACHE_SIZE": "1000"}) as (nc, prefix, child):
        writer = psutil.Process(int((await writer_status(nc, prefix))["pid"]))
        rss[0] = int(writer.memory_info().rss)
        marks = {total * k // 10: _rss_probe(rss, 10 * k, writer) for k in range(1, 11)}
        result = await drive_count(nc, command_subject(prefix, "create"), "(e) pamledger memory run",
                                   create_requests(_tag()), check_result, cfg.in_flight, total, marks)
        status = await writer_status(nc, prefix)
    result.extra.update(
        head_cache_size=1000, creates=total, rss_mib_by_percent={p: round(b / 2**20, 1) for p, b in sorted(rss.items())},
        rss20_mib=round(rss[20] / 2**20, 1), rss100_mib=round(rss[100] / 2**20, 1),
        ledger_sequence=status["ledger_sequence"], relayed_sequence=status["relayed_sequence"],
    )
    return {"e": result}
