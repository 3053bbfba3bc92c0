"""Where a create's CPU goes: every process of scenario (a) under load, Postgres split by the role it serves.

    .venv/bin/python -m bench cpu [--seconds 10] [--space hashing-384|minilm] [--in-flight 64]

Runs the real service (`pamledger run`, one process per role) on private servers, drives creates as scenario
(a) does, and prints CPU microseconds per create for each role process, for the Postgres backends each role
holds (matched by the client port of each connection: pg_stat_activity against the role's own sockets),
for the rest of Postgres (checkpointer, WAL writer, autovacuum: "postgres (server)"), nats-server and the
load driver, and then echo's CPU per request over the same processes, measured in the same run. The figures
are per create over the whole window, so a role whose work lags (the indexer's backlog) is charged only for
what it did in the window; the backlog at the end is printed beside it.
"""

from __future__ import annotations

import argparse
import asyncio
from typing import Any

import psutil  # type: ignore[import-untyped]
import psycopg

from bench.load import check_echo, create_requests, drive
from bench.scenarios import MODEL_FREE_SPACE, Config, _creates, indexer_drain, other_cpu, pamledger_service
from bench.servers import Servers, bench_servers
from bench.service import echo_service


def _role_pids(root: int) -> dict[int, str]:
    out = {root: "main"}
    for proc in psutil.Process(root).children(recursive=True):
        argv = proc.cmdline()
        if "--roles" in argv[:-1]:
            out[proc.pid] = argv[argv.index("--roles") + 1]
    return out


def _ports_by_role(roles: dict[int, str]) -> dict[int, str]:
    """Local TCP port → role, for every socket of every role process."""
    out: dict[int, str] = {}
    for pid, role in roles.items():
        try:
            for conn in psutil.Process(pid).net_connections(kind="tcp"):
                if conn.laddr:
                    out[conn.laddr.port] = role
        except psutil.NoSuchProcess:
            continue
    return out


async def _backends(db_url: str, ports: dict[int, str]) -> dict[int, str]:
    """Postgres backend pid → the role whose connection it serves."""
    async with await psycopg.AsyncConnection.connect(db_url, autocommit=True) as conn:
        rows = await (await conn.execute(
            "SELECT pid, client_port FROM pg_stat_activity WHERE client_port IS NOT NULL")).fetchall()
    return {int(pid): ports[port] for pid, port in rows if port in ports}


def _cpu(pids: dict[int, str]) -> dict[str, float]:
    out: dict[str, float] = {}
    for pid, name in pids.items():
        try:
            times = psutil.Process(pid).cpu_times()
        except psutil.NoSuchProcess:
            continue
        out[name] = out.get(name, 0.0) + times.user + times.system
    return out


def _delta(after: dict[str, float], before: dict[str, float], per: int) -> dict[str, int]:
    return {k: round((v - before.get(k, 0.0)) / per * 1e6) for k, v in after.items()}


async def measure(servers: Servers, seconds: float, space: str, in_flight: int) -> dict[str, Any]:
    cfg = Config(duration=seconds, warmup=1.0, in_flight=in_flight)
    env = {"PAMLEDGER_INDEXER__DEFAULT_SPACE": space} if space != "minilm" else None
    async with pamledger_service(servers, "cpu", env) as (nc, prefix, child, db_url):
        roles = _role_pids(child.pid)
        await _creates(nc, prefix, "warm-up", in_flight, Config(duration=1.0, warmup=0.5, in_flight=in_flight))
        backends = {pid: f"postgres for {role}" for pid, role in
                    (await _backends(db_url, _ports_by_role(roles))).items()}
        tracked = {**roles, **backends}
        before, others0 = _cpu(tracked), other_cpu(servers)
        result = await _creates(nc, prefix, "creates", in_flight, cfg)
        after, others1 = _cpu(tracked), other_cpu(servers)
        sent = result.extra["sent"]
        per = _delta(after, before, sent)
        rest = _delta(others1, others0, sent)
        rest["postgres (server)"] = rest.pop("postgres", 0) - sum(v for k, v in per.items() if k.startswith("postgres"))
        drain = await indexer_drain(db_url)
    echo_cfg = Config(duration=seconds, warmup=1.0, in_flight=in_flight)
    children: list[Any] = []
    async with echo_service(servers, "cpu", children) as (enc, subject):
        e0, eo0 = children[0].cpu_seconds(), other_cpu(servers)
        echo = await drive(enc, subject, "echo", create_requests("cpu"), check_echo, in_flight, echo_cfg.warmup,
                           echo_cfg.duration)
        e1, eo1 = children[0].cpu_seconds(), other_cpu(servers)
        echo_per = {"echo": round((e1 - e0) / echo.extra["sent"] * 1e6),
                    **_delta(eo1, eo0, echo.extra["sent"])}
    return {"space": space, "creates_per_s": round(result.rate, 1), "per_create": {**per, **rest},
            "echo_per_request": echo_per, "echo_per_s": round(echo.rate, 1), **drain}


def render(report: dict[str, Any]) -> str:
    lines = [f"space {report['space']}: {report['creates_per_s']} creates/s; echo {report['echo_per_s']} req/s",
             f"{'process':34} {'µs per create':>14}"]
    per = report["per_create"]
    for name, value in sorted(per.items(), key=lambda kv: -kv[1]):
        lines.append(f"{name:34} {value:>14}")
    total, echo_total = sum(per.values()), sum(report["echo_per_request"].values())
    lines.append(f"{'all processes':34} {total:>14}")
    lines.append(f"echo per request, same processes: {report['echo_per_request']} = {echo_total} µs;"
                 f" ratio {total / max(echo_total, 1):.2f}")
    lines.append(f"indexer backlog at the end {report['indexer_backlog_at_end']},"
                 f" drained in {report['indexer_drain_seconds']} s")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench cpu", description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--space", default=MODEL_FREE_SPACE, help="hashing-N or minilm (the service default)")
    parser.add_argument("--in-flight", type=int, default=64)
    args = parser.parse_args(argv)
    with bench_servers() as servers:
        report = asyncio.run(measure(servers, args.seconds, args.space, args.in_flight))
    print(render(report))
    return 0
