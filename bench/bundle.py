"""Export and import of one scope, against same-run baselines (issue [C1]'s targets).

- export: `pamledger export` (a process of its own, through the service) vs a raw binary COPY of the same
  rows (the scope's ledger rows with their versions and contents) through psycopg: rows/s, target >= 0.5x;
- memory: the export process's peak RSS (wait4's ru_maxrss) at the small and the large size, target within 20%;
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
import time
from pathlib import Path
from typing import Any

import psycopg

from bench.ledger_commands import LoadSpec, scope_ids
from bench.ledger_loader import load_ledger
from bench.servers import Servers, bench_servers
from bench.service import service_process
from memory_client.client import MemoryClient

ACTOR = {"actor_id": "actor:bench:bundle", "actor_kind": "agent"}
RAW = ("COPY (SELECT l.ledger_sequence, l.event, v.meta, c.content, c.salt FROM ledger l"
       " LEFT JOIN memory_versions v ON v.version_id = l.version_id"
       " LEFT JOIN content_store c ON c.content_digest = v.content_digest"
       " WHERE l.scope_id = %s ORDER BY l.ledger_sequence) TO STDOUT (FORMAT BINARY)")


def log(text: str) -> None:
    print(f"bench bundle: {text}", file=sys.stderr, flush=True)


async def raw_copy(url: str, scope_id: str) -> dict[str, Any]:
    rows = size = 0
    started = time.perf_counter()
    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
        async with conn.cursor().copy(RAW, (scope_id,)) as copy:
            async for block in copy:
                size += len(block)
        rows = (await (await conn.execute("SELECT count(*) FROM ledger WHERE scope_id = %s", (scope_id,))).fetchone()
                or (0,))[0]
    seconds = time.perf_counter() - started
    return {"rows": rows, "bytes": size, "seconds": round(seconds, 3), "rows_per_second": round(rows / seconds)}


def run_measured(args: list[str], env: dict[str, str]) -> tuple[float, int, str]:
    """(seconds, peak RSS in KiB, stdout) of `python -m pamledger ARGS`."""
    started = time.perf_counter()
    child = subprocess.Popen([sys.executable, "-m", "pamledger", *args], env=env, stdout=subprocess.PIPE,
                             stderr=subprocess.DEVNULL)
    out = child.stdout.read().decode() if child.stdout else ""
    _, status, usage = os.wait4(child.pid, 0)
    child.returncode = os.waitstatus_to_exitcode(status)
    seconds = time.perf_counter() - started
    if child.returncode != 0:
        raise RuntimeError(f"pamledger {args[0]} failed ({child.returncode}): {out[-2000:]}")
    return seconds, int(usage.ru_maxrss), out


def cli_env(servers: Servers, prefix: str) -> dict[str, str]:
    return {**os.environ, "PAMLEDGER_NATS_URL": servers.nats_url, "PAMLEDGER_SUBJECT_PREFIX": prefix,
            "PAMLEDGER_AUTH__MODE": "off", "PAMLEDGER_LOG_FORMAT": "json"}


async def export_at(servers: Servers, events: int, tmp: Path) -> dict[str, Any]:
    name, url = servers.fresh_database("bundle_src", migrated=False)
    load_ledger(url, LoadSpec(events=events, scopes=1, chunk=min(10_000, events)))
    scope = scope_ids(1)[0]
    out = tmp / f"export-{events}.pamb"
    async with service_process(servers, url, "bundle_src", roles="writer,query", answering=("writer", "query")) as (_, prefix, _s, _c):
        raw = await raw_copy(url, scope)
        seconds, rss, printed = run_measured(["export", scope, "--out", str(out), "--quiet"], cli_env(servers, prefix))
        raw_again = await raw_copy(url, scope)
    summary = json.loads(printed)
    best = max(raw["rows_per_second"], raw_again["rows_per_second"])
    rate = round(summary["counts"]["events"] / seconds)
    return {"events": summary["counts"]["events"], "versions": summary["counts"]["versions"],
            "bundle_bytes": out.stat().st_size, "export_seconds": round(seconds, 3), "export_rows_per_second": rate,
            "raw_copy_rows_per_second": best, "ratio": round(rate / best, 3), "export_peak_rss_kib": rss,
            "bundle": str(out), "database": name}


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
        seconds, rss, printed = run_measured(["import", bundle, "--quiet"], cli_env(servers, prefix))
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
