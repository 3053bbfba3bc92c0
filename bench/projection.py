"""`python -m bench projection`: the projection and Query on private servers, baselines in the same run.

1. loader: a synthetic, hash-chained ledger COPYed into a fresh database (bench.ledger_loader); with
   --quick the whole chain is checked with command_handler.verify.verify_tables.
2. replay: projector.replay.replay vs. raw binary COPY + msgspec decode of the same ledger
   (bench.projection_replay).
3. query: replay --swap builds current_objects, the real service answers structured and full-text
   queries through NATS; baselines NATS echo and SQL only; EXPLAIN of the slowest variants
   (bench.projection_query); a writer probe then appends to the loaded ledger through NATS and waits for
   the projection.
4. lag: open-loop creates on a fresh service, reply -> queryable via LISTEN (bench.projection_lag).
5. projector: the same lag at 5,000/s with the writer's work done beforehand (bench.projection_projector).
Every database is dropped and every service stopped at the end, also on error or Ctrl-C.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import platform
import random
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgspec
import psycopg

from bench.cli import interruptible, parse_steps
from bench.ledger_loader import LoadSpec, load_ledger, scope_ids
from bench.load import Result
from bench.projection_lag import lag_benchmark
from bench.projection_projector import projector_lag
from bench.projection_query import as_result, explain_variants, fulltext_maker, run_kind, sql_only, structured_maker
from bench.projection_replay import build_projection, replay_benchmark
from bench.projection_report import as_json, render
from bench.projection_service import service_on, writer_probe
from bench.scenarios import Config
from bench.servers import Servers, bench_servers
from bench.service import serial_echo
from command_handler.verify import verify_tables


@dataclass(frozen=True)
class ProjectionConfig:
    events: int
    scopes: int
    query_seconds: float
    query_warmup: float
    lag: Config
    verify: bool
    steps: tuple[str, ...] = ("ledger", "lag", "projector")


# ledger: loader, replay, query (they share the loaded ledger); lag: the service's commit -> queryable lag;
# projector: the same lag at 5,000/s with the writer's work done beforehand (bench.projection_projector)
STEPS = ("ledger", "lag", "projector")


def projection_config(quick: bool, events: int | None, steps: tuple[str, ...] = STEPS) -> ProjectionConfig:
    """Full: 1.3M events (~1M objects) in 100 scopes; quick: 65k events (~50k objects)."""
    return ProjectionConfig(events=events or (65_000 if quick else 1_300_000), scopes=100,
                    query_seconds=4.0 if quick else 12.0, query_warmup=1.0 if quick else 3.0,
                    lag=Config(duration=5.0 if quick else 15.0, warmup=1.0 if quick else 2.0), verify=quick,
                    steps=steps)


def log(text: str) -> None:
    print(f"bench projection: {text}", file=sys.stderr, flush=True)


def _progress(note: dict[str, Any], last: list[float]) -> None:
    if time.perf_counter() - last[0] >= 10 or note.get("events") == note.get("of"):
        last[0] = time.perf_counter()
        log(f"loader: {note['events']:,} of {note['of']:,} events")


def run_suite(servers: Servers, cfg: ProjectionConfig) -> dict[str, Any]:
    """Run all four benchmarks; returns their raw results (see bench.projection_report for the table)."""
    out: dict[str, Any] = {}
    if "ledger" in cfg.steps:
        _ledger_steps(servers, cfg, out)
        _checkpoint(servers)
    if "lag" in cfg.steps:
        log("lag: fresh service ...")
        out["lag"] = asyncio.run(lag_benchmark(servers, cfg.lag, log))
    if "projector" in cfg.steps:
        out["projector"] = asyncio.run(projector_lag(servers, cfg.lag, log))
    return out


def _ledger_steps(servers: Servers, cfg: ProjectionConfig, out: dict[str, Any]) -> None:
    """Loader, replay, projection and query over one bulk-loaded ledger."""
    db_name, url = servers.fresh_database("m2", migrated=False)
    try:
        log(f"loader: {cfg.events:,} events into a fresh database ...")
        last = [time.perf_counter()]
        out["load"] = load_ledger(url, LoadSpec(events=cfg.events, scopes=cfg.scopes), lambda n: _progress(n, last))
        log(f"loader: {out['load']['events_per_second']:,} events/s ({out['load']['seconds']} s)")
        if cfg.verify:
            out["verify"] = _verify(url, cfg.events)
        out["replay"] = asyncio.run(replay_benchmark(url, log))
        out["projection"] = asyncio.run(build_projection(url, log))
        out["query"] = asyncio.run(query_benchmark(servers, url, out["load"], cfg))
        if cfg.verify:  # the service's start adds its own entries (the system scope's actors) before the probe's
            out["verify_after_probe"] = _verify(url, cfg.events + 1, exact=False)
    finally:
        servers.drop_database(db_name)


def _checkpoint(servers: Servers) -> None:
    """Flush the earlier steps' dirty pages now, so their writes do not land in the lag window."""
    t0 = time.perf_counter()
    with contextlib.suppress(psycopg.Error), psycopg.connect(servers.admin_url, autocommit=True) as conn:
        conn.execute("CHECKPOINT")
    log(f"CHECKPOINT before the lag benchmark: {time.perf_counter() - t0:.1f} s")


def _verify(url: str, head: int, exact: bool = True) -> dict[str, Any]:
    """verify_tables over the ledger, which must hold `head` rows (`exact`) or at least that many."""
    t0 = time.perf_counter()
    report = verify_tables(url)  # the loaded ledger has no stream to anchor its head on
    report["seconds"] = round(time.perf_counter() - t0, 2)
    log(f"verify_ledger: {report}")
    if not report["ok"] or report["rows_checked"] < head or (exact and report["rows_checked"] != head):
        raise RuntimeError(f"the loaded ledger does not verify: {report}")
    return report


async def query_benchmark(servers: Servers, url: str, load: dict[str, Any], cfg: ProjectionConfig) -> dict[str, Any]:
    """Structured, second-page and full-text latency through the service; echo and SQL-only baselines."""
    rng = random.Random(7)
    scopes = scope_ids(cfg.scopes)
    head = int(load["head_sequence"])
    out: dict[str, Any] = {}
    async with service_on(servers, url, head, "m2q") as (nc, prefix, _child):
        log(f"query: structured, {cfg.query_warmup:g}+{cfg.query_seconds:g} s, 1 in flight")
        make = structured_maker(scopes, load["clock_start"], load["clock_end"], rng)
        first, second, s_stats = await run_kind(nc, prefix, make, cfg.query_warmup, cfg.query_seconds, True)
        log(f"query: full text, {cfg.query_warmup:g}+{cfg.query_seconds:g} s, 1 in flight")
        text, _, t_stats = await run_kind(nc, prefix, fulltext_maker(scopes, rng), cfg.query_warmup,
                                          cfg.query_seconds, False)
        out["structured"] = as_result("structured, first page", first, cfg.query_seconds)
        out["page2"] = as_result("structured, second page (cursor)", second, cfg.query_seconds)
        out["fulltext"] = as_result("full text", text, cfg.query_seconds)
        out["stats"] = {"structured": s_stats, "fulltext": t_stats}
        log("query: writer probe (update a loaded object through NATS, wait for the projection)")
        sample = s_stats.pop("sample_item")
        t_stats.pop("sample_item", None)
        out["probe"] = await writer_probe(nc, prefix, sample, head) if sample else {"ok": False}
    out["echo"] = await serial_echo(servers, "m2echo", first[0][2] if first else b"{}", 2.0)
    log("query: SQL-only baseline and EXPLAIN (ANALYZE, BUFFERS)")
    out["sql_structured"] = await sql_only(url, first)
    out["sql_fulltext"] = await sql_only(url, text)
    out["explain_structured"] = await explain_variants(url, first + second)
    out["explain_fulltext"] = await explain_variants(url, text)
    return out


def to_jsonable(value: Any) -> Any:
    """Results (bench.load.Result) become their summaries; everything else as is."""
    if isinstance(value, Result):
        return value.summary()
    if isinstance(value, dict):
        return {k: to_jsonable(v) for k, v in value.items()}
    if isinstance(value, list):
        return [to_jsonable(v) for v in value]
    if isinstance(value, msgspec.Struct):
        return msgspec.to_builtins(value)
    return value


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench projection", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="65k events (~50k objects), shorter query and lag runs")
    parser.add_argument("--events", type=int, default=None,
                        help="ledger events (default 1300000, ~1M objects; 65000 with --quick)")
    parser.add_argument("--steps", default=",".join(STEPS),
                        help="ledger (loader, replay, query), lag (the service), projector (the projector alone at"
                             " 5,000/s); default all three")
    parser.add_argument("--json", type=Path, default=None, help="also write every number, plan and verdict here")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    cfg = projection_config(args.quick, args.events, parse_steps(args.steps, STEPS, "--steps"))
    return interruptible(lambda: _run(args, cfg))


def _run(args: argparse.Namespace, cfg: ProjectionConfig) -> int:
    began = time.perf_counter()
    load_before = os.getloadavg()[0]
    with bench_servers() as servers:
        source = "private servers" if servers.private else "servers from PAMLEDGER_NATS_URL/PAMLEDGER_DATABASE_URL"
        log(f"{source}; {cfg.events:,} events; query {cfg.query_seconds:g} s per kind;"
            f" lag {cfg.lag.duration:g} s per attempt")
        results = run_suite(servers, cfg)
    load = results.get("load")
    ledger = (f"{load['events']:,} ledger events ({load['objects']:,} objects, {load['scopes']} scopes)" if load
              else "no ledger step")
    header = (f"pamledger bench projection{' --quick' if args.quick else ''}: steps {','.join(cfg.steps)};"
              f" {ledger}; {os.cpu_count()} cores; {source};"
              f" {time.perf_counter() - began:.0f} s wall; 1-min load average {load_before:.1f} at start,"
              f" {os.getloadavg()[0]:.1f} at end")
    print(render(results, header))
    if args.json is not None:
        meta = {"suite": "projection", "quick": args.quick, "events": cfg.events, "source": source,
                "cores": os.cpu_count(), "python": platform.python_version(),
                "wall_seconds": round(time.perf_counter() - began, 1), "time": time.time(),
                "loadavg_start": load_before, "loadavg_end": os.getloadavg()[0]}
        args.json.write_text(json.dumps(as_json(results, meta, to_jsonable), indent=2, default=str) + "\n")
    return 0
