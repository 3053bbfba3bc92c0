"""Creates/s and CPU per create with 1, 2 and 4 partitions, creates spread over many scopes, in one run.

    .venv/bin/python -m bench partitions [--seconds 8] [--in-flight 64] [--scopes 64] [--counts 1,2,4]
                                         [--one-process]

For each partition count: a fresh database, one `pamledger serve --roles writer` process per partition (a
share of one partition each: infra.settings writer.partition_share; `--one-process`: one process leading them
all, to tell the cost of partitions from the cost of processes), `--scopes` scopes created, then creates
round robin over them (unique idempotency keys), `--in-flight` at once, for `--seconds`. Only the writers run
(no projector, indexer or gateway): the write path alone. CPU per create is the writer processes', the
servers' (Postgres, NATS: when private) and the load driver's over the window. The 1-partition row is the
same-run baseline; the others print their ratio to it.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any

import msgspec
from nats.aio.client import Client as NATS

from bench.load import ACTOR, PROVENANCE, check_result, drive
from bench.procs import Child, python_child, wait_answering
from bench.scenarios import Config, other_cpu
from bench.servers import Servers, bench_servers
from bench.service import connect, service_names
from pamledger_client.protocol.subjects import command_subject, status_subject

_encoder = msgspec.json.Encoder()


def _create(scope_id: str) -> bytes:
    return _encoder.encode({"scope_id": scope_id, "object_type": "claim",
                            "canonical_content": {"text": "the benchmark sky is blue", "confidence": 0.5},
                            "actor": ACTOR, "provenance": PROVENANCE})


@contextlib.asynccontextmanager
async def writers(servers: Servers, partitions: int, one_process: bool = False
                  ) -> AsyncIterator[tuple[NATS, str, list[Child]]]:
    """(nc, prefix, writer processes): one writer process per partition on a fresh database, all leading."""
    db_name, db_url = servers.fresh_database(f"p{partitions}")
    prefix, stream = service_names(f"p{partitions}")
    env = {"PAMLEDGER_NATS_URL": servers.nats_url, "PAMLEDGER_DATABASE_URL": db_url,
           "PAMLEDGER_SUBJECT_PREFIX": prefix, "PAMLEDGER_STREAM_NAME": stream, "PAMLEDGER_LOG_FORMAT": "json",
           "PAMLEDGER_AUTH__MODE": "off", "PAMLEDGER_STATE_DIR": str(servers.work_dir / f"state-{prefix}"),
           "PAMLEDGER_PARTITIONS": str(partitions), "PAMLEDGER_WRITER__PARTITION_SHARE": "0" if one_process else "1",
           "PAMLEDGER_METRICS__PORT": "0"}
    children = [python_child(f"writer-{prefix}-{i}", "pamledger", env, servers.work_dir, "serve", "--roles", "writer")
                for i in range(1 if one_process else partitions)]
    nc = await connect(servers.nats_url)
    try:
        for child in children:
            child.start()
        led = [f"writer.p{p}" if partitions > 1 else "writer" for p in range(partitions)]
        for subject in led:
            await wait_answering(nc, children[0], status_subject(prefix, subject), timeout=120)
        await _all_processes_lead(nc, prefix, partitions, children)
        yield nc, prefix, children
    finally:
        for child in children:
            child.stop()
        with contextlib.suppress(Exception):
            await nc.close()
        servers.drop_database(db_name)


async def _all_processes_lead(nc: NATS, prefix: str, partitions: int, children: list[Child]) -> None:
    """Wait (up to 30 s) until every writer process leads a partition (the share settles within a few polls)."""
    if partitions == 1:
        return
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        pids = set()
        for p in range(partitions):
            with contextlib.suppress(Exception):
                msg = await nc.request(status_subject(prefix, f"writer.p{p}"), b"{}", timeout=1)
                pids.add(_pid(msg.data))
        if pids == {c.pid for c in children}:
            return
        await asyncio.sleep(0.2)
    raise RuntimeError("the writer processes did not split the partitions")


def _pid(data: bytes) -> int:
    return int(msgspec.json.decode(data)["result"]["pid"])


async def measure(servers: Servers, partitions: int, cfg: Config, scopes: int, one_process: bool) -> dict[str, Any]:
    async with writers(servers, partitions, one_process) as (nc, prefix, children):
        scope_ids = [f"workspace:bench-{uuid.uuid4().hex[:8]}-{i}" for i in range(scopes)]
        for scope_id in scope_ids:
            reply = await nc.request(command_subject(prefix, "create_scope"),
                                     _encoder.encode({"scope_id": scope_id, "scope_kind": "workspace"}), timeout=10)
            check_result(reply.data, b"")
        bodies = [_create(s) for s in scope_ids]
        tag = uuid.uuid4().hex[:8]
        make = lambda i: (bodies[i % len(bodies)], {"Pam-Idempotency-Key": f"bench:{tag}:{i}"})  # noqa: E731
        warm = Config(duration=1.0, warmup=0.5, in_flight=cfg.in_flight)
        await drive(nc, command_subject(prefix, "create"), "warm-up", make_offset(make, 10_000_000), check_result,
                    warm.in_flight, warm.warmup, warm.duration)
        cpu0 = sum(c.cpu_seconds() for c in children), other_cpu(servers)
        result = await drive(nc, command_subject(prefix, "create"), f"{partitions} partition(s)", make, check_result,
                             cfg.in_flight, cfg.warmup, cfg.duration)
        cpu1 = sum(c.cpu_seconds() for c in children), other_cpu(servers)
        sent = result.extra["sent"]
        for child in children:
            if not child.alive():
                raise RuntimeError(f"{child.name} died:\n{child.log_tail()}")
        other = {k: round((v - cpu0[1].get(k, 0.0)) / sent * 1e6) for k, v in cpu1[1].items()}
        return {"partitions": partitions, "writer_processes": len(children), "creates_per_second": round(result.rate),
                "p50_ms": round(result.quantile(0.5) * 1e3, 2), "p99_ms": round(result.quantile(0.99) * 1e3, 2),
                "writer_cpu_us_per_create": round((cpu1[0] - cpu0[0]) / sent * 1e6), "other_cpu_us_per_create": other}


def make_offset(make: Any, offset: int) -> Any:
    return lambda i: make(i + offset)


def report(rows: list[dict[str, Any]]) -> None:
    base = rows[0]
    print(f"{'partitions':>10} {'procs':>5} {'creates/s':>10} {'x base':>7} {'p50 ms':>8} {'p99 ms':>8}"
          f" {'writer us/create':>17} {'x base':>7}  other us/create")
    for row in rows:
        ratio = row["creates_per_second"] / base["creates_per_second"]
        cpu_ratio = row["writer_cpu_us_per_create"] / max(1, base["writer_cpu_us_per_create"])
        print(f"{row['partitions']:>10} {row['writer_processes']:>5} {row['creates_per_second']:>10} {ratio:>7.2f}"
              f" {row['p50_ms']:>8} {row['p99_ms']:>8} {row['writer_cpu_us_per_create']:>17} {cpu_ratio:>7.2f}"
              f"  {row['other_cpu_us_per_create']}")


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench partitions", description=__doc__.split("\n")[0])
    parser.add_argument("--seconds", type=float, default=8.0)
    parser.add_argument("--in-flight", type=int, default=64)
    parser.add_argument("--scopes", type=int, default=64)
    parser.add_argument("--counts", default="1,2,4", help="partition counts; the first is the baseline")
    parser.add_argument("--one-process", action="store_true", help="one writer process leading every partition")
    args = parser.parse_args(argv)
    cfg = Config(duration=args.seconds, warmup=1.0, in_flight=args.in_flight)
    counts = [int(c) for c in args.counts.split(",")]
    with bench_servers() as servers:
        rows = [asyncio.run(measure(servers, count, cfg, args.scopes, args.one_process)) for count in counts]
    report(rows)
    return 0
