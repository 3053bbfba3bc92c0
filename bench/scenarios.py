"""The NATS-driven scenarios: (a) pamledger, (b) naive writer, (c) echo, (e) writer memory.

Each scenario gets a fresh database (migrated), its own subject prefix and stream name, its service in a
separate process, and cleans all of that up when it ends, whether it succeeded or not.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
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
from pamledger_client.protocol.subjects import command_subject, status_subject


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
                            ) -> AsyncIterator[tuple[NATS, str, Child, str]]:
    """(nc, prefix, child, database URL): the real service on a fresh database with the bench scope created;
    the database is dropped after."""
    db_name, db_url = servers.fresh_database(label)
    try:
        async with service_process(servers, db_url, label, extra_env) as (nc, prefix, _stream, child):
            await create_scope(nc, prefix)
            yield nc, prefix, child, db_url
    finally:
        servers.drop_database(db_name)


async def writer_status(nc: NATS, prefix: str, token: str | None = None) -> dict[str, Any]:
    """The writer's status; with auth enforced `token` must be an administrator's (positions and pid)."""
    headers = {"Authorization": f"Bearer {token}"} if token is not None else None
    msg = await nc.request(status_subject(prefix, "writer"), b"{}", timeout=5, headers=headers)
    return msgspec.json.decode(msg.data)["result"]  # type: ignore[no-any-return]


MODEL_FREE_SPACE = "hashing-384"  # the default space's dimensions without a model: what the indexer costs apart
DRAIN_LIMIT_SECONDS = 30.0


async def scenario_a(servers: Servers, cfg: Config, space: str | None = None, key: str = "a") -> dict[str, Result]:
    """pamledger creates through NATS: 64 in flight, then 1 in flight on a second fresh service and database;
    `space`: the indexer's default space (None: the service's own default, the model).

    The serial run gets its own service so that no backlog left by the loaded run (relay, projections)
    competes with it. After the loaded run the indexer's backlog is read and then waited for (up to 30 s):
    throughput bought with an unbounded backlog does not count.
    """
    env = {"PAMLEDGER_INDEXER__DEFAULT_SPACE": space} if space else None
    async with pamledger_service(servers, key, env) as (nc, prefix, child, db_url):
        cpu0, others0 = child.cpu_by_process(), other_cpu(servers)
        fast = await _creates(nc, prefix, f"({key}) pamledger create", cfg.in_flight, cfg)
        cpu1, others1 = child.cpu_by_process(), other_cpu(servers)
        per_create = {k: round((v - cpu0.get(k, 0.0)) / fast.extra["sent"] * 1e6) for k, v in cpu1.items()}
        fast.extra["service_cpu_us_per_create"] = sum(per_create.values())
        fast.extra["service_cpu_us_per_create_by_process"] = per_create
        fast.extra["other_cpu_us_per_create"] = {
            k: round((v - others0[k]) / fast.extra["sent"] * 1e6) for k, v in others1.items()}
        fast.extra.update(await indexer_drain(db_url))
        fast.extra["space"] = space or "service default"
    async with pamledger_service(servers, f"{key}s", env) as (nc, prefix, child, _db):
        serial = await _creates(nc, prefix, f"({key}) pamledger create, serial", 1, cfg)
    return {key: fast, f"{key}_serial": serial}


async def indexer_drain(db_url: str, limit: float = DRAIN_LIMIT_SECONDS) -> dict[str, Any]:
    """The indexer's backlog (ledger head − its checkpoint) when the load ended, and how long it took to reach
    0 (None: not within `limit` seconds; `indexer_backlog_after_limit` then says how far it was)."""
    from indexer.report import spaces_report

    async with await psycopg.AsyncConnection.connect(db_url, autocommit=True) as conn:
        at_end = (await spaces_report(conn, 0, counts=False))["backlog"]
        began = time.monotonic()
        backlog = at_end
        while backlog > 0 and time.monotonic() - began < limit:
            await asyncio.sleep(0.2)
            backlog = (await spaces_report(conn, 0, counts=False))["backlog"]
    drained = round(time.monotonic() - began, 1) if backlog <= 0 else None
    return {"indexer_backlog_at_end": at_end, "indexer_drain_seconds": drained,
            "indexer_backlog_after_limit": backlog if drained is None else 0}


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
    children: list[Child] = []
    async with echo_service(servers, "c", children) as (nc, subject):
        cpu0, others0 = children[0].cpu_seconds(), other_cpu(servers)
        fast = await drive(nc, subject, "(c) NATS echo", create_requests(_tag()), check_echo,
                           cfg.in_flight, cfg.warmup, cfg.duration)
        sent = fast.extra["sent"]
        fast.extra["service_cpu_us_per_create"] = round((children[0].cpu_seconds() - cpu0) / sent * 1e6)
        fast.extra["other_cpu_us_per_create"] = {
            k: round((v - others0[k]) / sent * 1e6) for k, v in other_cpu(servers).items()}
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
    async with pamledger_service(servers, "e", {"PAMLEDGER_WRITER__HEAD_CACHE_SIZE": "1000"}) as (nc, prefix, child, _):
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
