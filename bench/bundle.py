"""Export and import of one scope, against same-run baselines (issue [C1]'s targets).

- export: `pamledger export` (a process of its own, through the service) vs a raw binary COPY of the same
  rows (the scope's ledger rows with their versions and contents) through psycopg: rows/s, target >= 0.5x;
- memory: the export process's peak RSS (its VmHWM, sampled) at the small and the large size, target within 20%;
- import: `pamledger import` of that bundle into a fresh service vs the writer's create throughput in the same
  run (the SDK sending creates `--concurrency` at a time): entries/s vs creates/s, target >= 0.3x.

The scope is loaded straight into Postgres by bench.ledger_loader (one scope holding every event).
`python -m bench bundle [--events N] [--small N]`.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import psycopg
from nats.aio.client import Client as NATS

from bench.ledger_commands import LoadSpec, scope_ids
from bench.ledger_loader import load_ledger
from bench.procs import tree_cpu
from bench.scenarios import writer_status
from bench.servers import Servers, bench_servers
from bench.service import service_process
from pamledger_client.client import MemoryClient

ACTOR = {"actor_id": "actor:bench:bundle", "actor_kind": "agent"}
RAW = ("COPY (SELECT l.ledger_sequence, l.event, v.meta, c.content, c.salt FROM ledger l"
       " LEFT JOIN memory_versions v ON v.version_id = l.version_id"
       " LEFT JOIN content_store c ON c.content_digest = v.content_digest"
       " WHERE l.scope_id = %s ORDER BY l.ledger_sequence) TO STDOUT (FORMAT BINARY)")


def log(text: str) -> None:
    print(f"bench bundle: {text}", file=sys.stderr, flush=True)


async def raw_copy(servers: Servers, url: str, scope_id: str) -> dict[str, Any]:
    rows = size = 0
    cpu = _postgres_cpu(servers)
    started = time.perf_counter()
    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
        async with conn.cursor().copy(RAW, (scope_id,)) as copy:
            async for block in copy:
                size += len(block)
        seconds = time.perf_counter() - started
        cpu = _postgres_cpu(servers) - cpu  # before the connection closes: its backend's CPU counts
        rows = (await (await conn.execute("SELECT count(*) FROM ledger WHERE scope_id = %s", (scope_id,))).fetchone()
                or (0,))[0]
    return {"rows": rows, "bytes": size, "seconds": round(seconds, 3), "rows_per_second": round(rows / seconds),
            "postgres_cpu_us_per_row": round(cpu * 1e6 / rows)}


def _postgres_cpu(servers: Servers) -> float:
    """CPU seconds so far of the private Postgres (postmaster and its living backends); 0 with outside servers."""
    pid = servers.server_pids.get("postgres")
    return sum(tree_cpu(pid).values()) if pid else 0.0


def _vm_hwm_kib(pid: int) -> int | None:
    """The process's peak RSS since its exec (VmHWM in /proc/PID/status), None once it has exited."""
    try:
        with open(f"/proc/{pid}/status", "rb") as status:
            for line in status:
                if line.startswith(b"VmHWM:"):
                    return int(line.split()[1])
    except (FileNotFoundError, ProcessLookupError):
        return None
    return None  # a zombie: its memory is gone, its status has no VmHWM


def run_measured(args: list[str], env: dict[str, str]) -> tuple[float, int, float, str]:
    """(seconds, peak RSS in KiB, CPU seconds, stdout) of `python -m pamledger ARGS`.

    The peak is the child's VmHWM, sampled every 10 ms until it exits (VmHWM only grows, so the last sample
    misses at most the final 10 ms). Not wait4's ru_maxrss: subprocess starts the child with vfork, and
    exec records the parent's peak RSS as the child's, so ru_maxrss was this bench process's own peak."""
    started = time.perf_counter()
    peak = 0
    with tempfile.TemporaryFile() as stdout:
        child = subprocess.Popen([sys.executable, "-m", "pamledger", *args], env=env, stdout=stdout,
                                 stderr=subprocess.DEVNULL)
        while True:  # sampled only while not reaped: the pid cannot be another process's yet
            peak = max(peak, _vm_hwm_kib(child.pid) or 0)
            pid, status, usage = os.wait4(child.pid, os.WNOHANG)
            if pid:
                break
            time.sleep(0.01)
        seconds = time.perf_counter() - started
        child.returncode = os.waitstatus_to_exitcode(status)
        stdout.seek(0)
        out = stdout.read().decode()
    if child.returncode != 0:
        raise RuntimeError(f"pamledger {args[0]} failed ({child.returncode}): {out[-2000:]}")
    return seconds, peak, usage.ru_utime + usage.ru_stime, out


def cli_env(servers: Servers, prefix: str) -> dict[str, str]:
    return {**os.environ, "PAMLEDGER_NATS_URL": servers.nats_url, "PAMLEDGER_SUBJECT_PREFIX": prefix,
            "PAMLEDGER_AUTH__MODE": "off", "PAMLEDGER_LOG_FORMAT": "json"}


async def export_at(servers: Servers, events: int, tmp: Path) -> dict[str, Any]:
    name, url = servers.fresh_database("bundle_src", migrated=False)
    load_ledger(url, LoadSpec(events=events, scopes=1, chunk=min(10_000, events)))
    scope = scope_ids(1)[0]
    out = tmp / f"export-{events}.pamb"
    async with service_process(servers, url, "bundle_src", roles="writer,query", answering=("writer", "query")) as (nc, prefix, _s, service):
        await relayed(nc, prefix, events)
        raw = await raw_copy(servers, url, scope)
        before = (service.cpu_seconds(), _postgres_cpu(servers))
        seconds, rss, cpu, printed = run_measured(["export", scope, "--out", str(out), "--quiet"],
                                                  cli_env(servers, prefix))
        after = (service.cpu_seconds(), _postgres_cpu(servers))
        raw_again = await raw_copy(servers, url, scope)
    summary = json.loads(printed)
    best = max(raw["rows_per_second"], raw_again["rows_per_second"])
    rows = summary["counts"]["events"]
    rate = round(rows / seconds)
    per_row = {"export process": cpu, "service": after[0] - before[0], "postgres": after[1] - before[1]}
    return {"events": rows, "versions": summary["counts"]["versions"],
            "bundle_bytes": out.stat().st_size, "export_seconds": round(seconds, 3), "export_rows_per_second": rate,
            "raw_copy_rows_per_second": best, "ratio": round(rate / best, 3), "export_peak_rss_kib": rss,
            "export_cpu_us_per_row": {name: round(value * 1e6 / rows) for name, value in per_row.items()},
            "raw_copy_postgres_cpu_us_per_row": min(raw["postgres_cpu_us_per_row"], raw_again["postgres_cpu_us_per_row"]),
            "bundle": str(out), "database": name}


async def relayed(nc: NATS, prefix: str, head: int, limit: float = 300.0) -> None:
    """Wait until the writer's relay has published the loaded ledger to the stream: until then it works on the
    same cores as the export, and its CPU would count as the export's service CPU."""
    deadline = time.monotonic() + limit
    while (await writer_status(nc, prefix)).get("relayed_sequence", 0) < head:
        if time.monotonic() > deadline:
            raise TimeoutError(f"the relay did not publish {head} entries within {limit} s")
        await asyncio.sleep(0.2)


async def creates_per_second(servers: Servers, count: int, concurrency: int) -> float:
    _, url = servers.fresh_database("bundle_creates")
    async with service_process(servers, url, "bundle_creates", roles="writer,query", answering=("writer", "query")) as (nc, prefix, _s, _c):
        client = MemoryClient(nc, prefix)
        await client.create_scope("workspace:bench-creates")
        semaphore = asyncio.Semaphore(concurrency)

        async def one(i: int) -> None:
            async with semaphore:
                await client.create("workspace:bench-creates", "claim", {"statement": f"bench {i} " * 8}, ACTOR,
                                    {"provenance_id": "prov:bench", "actor": ACTOR, "activity": "bench"})
        started = time.perf_counter()
        await asyncio.gather(*(one(i) for i in range(count)))
        return count / (time.perf_counter() - started)


async def import_rate(servers: Servers, bundle: str) -> dict[str, Any]:
    _, url = servers.fresh_database("bundle_dst")
    async with service_process(servers, url, "bundle_dst", roles="writer,query", answering=("writer", "query")) as (_, prefix, _s, _c):
        seconds, rss, _, printed = run_measured(["import", bundle, "--quiet"], cli_env(servers, prefix))
    result = json.loads(printed)
    written = result["entries_written"]
    return {"entries_written": written, "import_seconds": round(seconds, 3),
            "import_entries_per_second": round(written / seconds), "import_peak_rss_kib": rss}


async def run(args: argparse.Namespace) -> dict[str, Any]:
    with bench_servers() as servers:
        tmp = servers.work_dir
        log(f"export of {args.small} events")
        small = await export_at(servers, args.small, tmp)
        log(f"export of {args.events} events")
        large = await export_at(servers, args.events, tmp)
        log("writer creates/s (baseline)")
        creates = await creates_per_second(servers, args.creates, args.concurrency)
        log("import")
        imported = await import_rate(servers, large["bundle"])
    return {
        "export_small": small, "export_large": large,
        "export_vs_raw_copy": large["ratio"], "export_target": 0.5,
        "rss_large_over_small": round(large["export_peak_rss_kib"] / small["export_peak_rss_kib"], 3),
        "rss_target": "within 1.2x",
        "creates_per_second": round(creates), "import": imported,
        "import_vs_creates": round(imported["import_entries_per_second"] / creates, 3), "import_target": 0.3,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench bundle", description=__doc__)
    parser.add_argument("--events", type=int, default=100_000, help="events of the large scope (default %(default)s)")
    parser.add_argument("--small", type=int, default=10_000, help="events of the small scope (default %(default)s)")
    parser.add_argument("--creates", type=int, default=5_000, help="creates of the baseline (default %(default)s)")
    parser.add_argument("--concurrency", type=int, default=64)
    report = asyncio.run(run(parser.parse_args(argv)))
    print(json.dumps(report, indent=2, sort_keys=True))
    return 0
