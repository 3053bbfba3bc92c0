"""`python -m bench write_path` (the default): the write path against baselines measured in the same run.

Scenarios (see bench/README.md): a = pamledger creates over NATS (64 in flight, then 1), h = the same with a
model-free Embedding Space (hashing-384: what the model costs the write path shows as a against h), b = naive
writer, c = NATS echo (64, then 1), d = eventsourcing library, e = writer memory; the durable-commit
floor runs whenever a or c does (the serial ratio needs it), or alone as `commit`.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import sys
import time
from pathlib import Path

from bench.append_floor import run_append_floor
from bench.baselines import run_commit_floor, run_eventsourcing
from bench.cli import interruptible
from bench.load import Result
from bench.scenarios import MODEL_FREE_SPACE, Config, scenario_a, scenario_b, scenario_c, scenario_e
from bench.servers import Servers, bench_servers
from bench.write_path_report import as_json, render

ORDER = ("c", "a", "h", "f", "b", "d", "commit", "e")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench [write_path]", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--duration", type=float, default=10.0, help="measured seconds per scenario (default 10)")
    parser.add_argument("--quick", action="store_true", help="2.5 s per scenario and a short memory run (smoke test)")
    parser.add_argument("--only", default=",".join(ORDER), help="comma-separated subset of a,b,c,d,e,f,h,commit")
    parser.add_argument("--json", type=Path, default=None, help="also write the results as JSON to this path")
    parser.add_argument("--in-flight", type=int, default=64, help="concurrent requests for a, b, c (default 64)")
    parser.add_argument("--mem-creates", type=int, default=None,
                        help="creates in the memory run e (default 100000, 20000 with --quick)")
    args = parser.parse_args(argv)
    wanted = {x.strip() for x in args.only.split(",") if x.strip()}
    unknown = wanted - set(ORDER)
    if unknown:
        parser.error(f"unknown scenario(s) {sorted(unknown)}; choose from {','.join(ORDER)}")
    if wanted & {"a", "c", "h"}:
        wanted.add("commit")
    if "a" in wanted:
        wanted |= {"f", "h"}  # (h): (a) with a model-free space, so the indexer's share shows
    args.selected = [x for x in ORDER if x in wanted]
    if args.duration <= 0 or args.in_flight < 1:
        parser.error("--duration must be > 0 and --in-flight >= 1")
    return args


def make_config(args: argparse.Namespace) -> Config:
    duration = 2.5 if args.quick else args.duration
    warmup = 0.5 if args.quick else min(2.0, max(0.5, 0.2 * duration))
    creates = args.mem_creates or (20_000 if args.quick else 100_000)
    return Config(duration=duration, warmup=warmup, in_flight=args.in_flight, mem_creates=creates)


def run_one(name: str, servers: Servers, cfg: Config) -> dict[str, Result]:
    if name == "a":
        return asyncio.run(scenario_a(servers, cfg))
    if name == "h":
        return asyncio.run(scenario_a(servers, cfg, MODEL_FREE_SPACE, "h"))
    if name == "b":
        return asyncio.run(scenario_b(servers, cfg))
    if name == "c":
        return asyncio.run(scenario_c(servers, cfg))
    if name == "e":
        return asyncio.run(scenario_e(servers, cfg))
    if name == "d":
        db_name, _ = servers.fresh_database("d", migrated=False)
        try:
            return {"d": run_eventsourcing(servers.pg_params(db_name), cfg.es_threads, cfg.warmup, cfg.duration)}
        finally:
            servers.drop_database(db_name)
    if name == "f":
        db_name, url = servers.fresh_database("f")
        try:
            return {"f": run_append_floor(url, cfg.warmup, cfg.duration, cfg.in_flight)}
        finally:
            servers.drop_database(db_name)
    db_name, url = servers.fresh_database("commit", migrated=False)
    try:
        return {"commit": run_commit_floor(url, cfg.warmup, cfg.duration)}
    finally:
        servers.drop_database(db_name)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    cfg = make_config(args)
    return interruptible(lambda: _run(args, cfg))


def _run(args: argparse.Namespace, cfg: Config) -> int:
    results: dict[str, Result] = {}
    began = time.perf_counter()
    with bench_servers() as servers:
        source = "private servers" if servers.private else "servers from PAMLEDGER_NATS_URL/PAMLEDGER_DATABASE_URL"
        print(f"bench: {source}; scenarios {','.join(args.selected)}; {cfg.duration:g} s each after"
              f" {cfg.warmup:g} s warm-up", file=sys.stderr, flush=True)
        for name in args.selected:
            t0 = time.perf_counter()
            print(f"bench: running {name} ...", file=sys.stderr, flush=True)
            try:
                results.update(run_one(name, servers, cfg))
            except Exception as exc:
                print(f"bench: FAILED in scenario {name}: {type(exc).__name__}: {exc}", file=sys.stderr, flush=True)
                raise
            print(f"bench: {name} done in {time.perf_counter() - t0:.1f} s", file=sys.stderr, flush=True)
    header = (f"pamledger bench write_path: {cfg.duration:g} s measured per scenario after {cfg.warmup:g} s warm-up;"
              f" {cfg.in_flight} in flight for a/b/c; {os.cpu_count()} cores; {source}")
    print(render(results, header))
    if args.json is not None:
        meta = {"duration": cfg.duration, "warmup": cfg.warmup, "in_flight": cfg.in_flight, "source": source,
                "cores": os.cpu_count(), "python": platform.python_version(), "scenarios": args.selected,
                "wall_seconds": round(time.perf_counter() - began, 1), "time": time.time()}
        args.json.write_text(json.dumps(as_json(results, meta), indent=2, default=str) + "\n")
    return 0
