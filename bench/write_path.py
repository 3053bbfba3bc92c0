"""`python -m bench`: pamledger against baselines measured in the same run, on private servers.

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
import signal
import sys
import time
from pathlib import Path
from typing import Any

from bench.append_floor import run_append_floor
from bench.baselines import run_commit_floor, run_eventsourcing
from bench.load import Result
from bench.write_path_report import as_json, render
from bench.scenarios import MODEL_FREE_SPACE, Config, scenario_a, scenario_b, scenario_c, scenario_e
from bench.servers import Servers, bench_servers
from infra.logging import configure_logging

ORDER = ("c", "a", "h", "f", "b", "d", "commit", "e")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--duration", type=float, default=10.0, help="measured seconds per scenario (default 10)")
    parser.add_argument("--quick", action="store_true", help="2.5 s per scenario and a short memory run (smoke test)")
    parser.add_argument("--only", default=",".join(ORDER), help="comma-separated subset of a,b,c,d,e,f,h,commit")
    parser.add_argument("--json", type=Path, default=None, help="also write the results as JSON to this path")
    parser.add_argument("--in-flight", type=int, default=64, help="concurrent requests for a, b, c (default 64)")
    parser.add_argument("--mem-creates", type=int, default=None,
                        help="creates in the memory run e (default 100000, 20000 with --quick)")
    parser.add_argument("--m2", action="store_true",
                        help="run the M2 suite instead (loader, replay, query, projector lag; see bench/projection.py)")
    parser.add_argument("--m2-events", type=int, default=None,
                        help="ledger events for --m2 (default 1300000, ~1M objects; 65000 with --quick)")
    parser.add_argument("--m3", action="store_true",
                        help="run the M3 suite instead (Subscribe: catch-up, live latency, fan-out; see bench/subscribe.py)")
    parser.add_argument("--m3-events", type=int, default=None,
                        help="catch-up ledger events for --m3 (default 200000; 20000 with --quick)")
    parser.add_argument("--m3-subscriptions", type=int, default=None,
                        help="fan-out subscriptions for --m3, 10 per scope (default 1000; 200 with --quick)")
    parser.add_argument("--m2-steps", default="ledger,lag,projector",
                        help="M2 parts: ledger (loader, replay, query), lag (the service), projector (the projector"
                             " alone at 5,000/s); default all three")
    parser.add_argument("--m3-steps", default="catchup,live,light,fanout",
                        help="comma-separated subset of the M3 steps (default all four)")
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


def _steps(text: str, allowed: tuple[str, ...], flag: str) -> tuple[str, ...]:
    """A comma-separated subset of a suite's steps, in the order given; anything else stops the run."""
    steps = tuple(x.strip() for x in text.split(",") if x.strip())
    if not steps or set(steps) - set(allowed):
        raise SystemExit(f"{flag}: choose from {','.join(allowed)}")
    return steps


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


def _terminate(signum: int, frame: Any) -> None:
    """SIGTERM takes the Ctrl-C path: inside asyncio.run that cancels the scenario, whose cleanup then runs."""
    handler = signal.getsignal(signal.SIGINT)
    if callable(handler):
        handler(signal.SIGINT, frame)
    else:
        raise KeyboardInterrupt


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if "--m4-search" in argv:  # `make bench BENCH_ARGS="--m4-search --quick"`: bench/search.py, its own flags
        from bench import search

        return search.main([a for a in argv if a != "--m4-search"])
    args = parse_args(argv)
    cfg = make_config(args)
    configure_logging("console", os.environ.get("PAMLEDGER_BENCH_LOG_LEVEL", "warning"))
    signal.signal(signal.SIGINT, signal.default_int_handler)  # even if started with SIGINT ignored
    signal.signal(signal.SIGTERM, _terminate)
    try:
        if args.m3:
            return _run_m3(args)
        return _run_m2(args) if args.m2 else _run(args, cfg)
    except KeyboardInterrupt:
        print("bench: interrupted; services and servers stopped", file=sys.stderr)
        return 130


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
    header = (f"pamledger bench: {cfg.duration:g} s measured per scenario after {cfg.warmup:g} s warm-up;"
              f" {cfg.in_flight} in flight for a/b/c; {os.cpu_count()} cores; {source}")
    print(render(results, header))
    if args.json is not None:
        meta = {"duration": cfg.duration, "warmup": cfg.warmup, "in_flight": cfg.in_flight, "source": source,
                "cores": os.cpu_count(), "python": platform.python_version(), "scenarios": args.selected,
                "wall_seconds": round(time.perf_counter() - began, 1), "time": time.time()}
        args.json.write_text(json.dumps(as_json(results, meta), indent=2, default=str) + "\n")
    return 0


def _run_m2(args: argparse.Namespace) -> int:
    """The M2 suite (bench/projection.py): its own table and JSON."""
    from bench import projection, projection_report

    cfg = projection.projection_config(args.quick, args.m2_events, _steps(args.m2_steps, projection.STEPS, "--m2-steps"))
    began = time.perf_counter()
    load_before = os.getloadavg()[0]
    with bench_servers() as servers:
        source = "private servers" if servers.private else "servers from PAMLEDGER_NATS_URL/PAMLEDGER_DATABASE_URL"
        projection.log(f"{source}; {cfg.events:,} events; query {cfg.query_seconds:g} s per kind;"
               f" lag {cfg.lag.duration:g} s per attempt")
        results = projection.run_suite(servers, cfg)
    load = results.get("load")
    ledger = (f"{load['events']:,} ledger events ({load['objects']:,} objects, {load['scopes']} scopes)" if load
              else "no ledger step")
    header = (f"pamledger bench --m2{' --quick' if args.quick else ''}: steps {','.join(cfg.steps)}; {ledger};"
              f" {os.cpu_count()} cores; {source};"
              f" {time.perf_counter() - began:.0f} s wall; 1-min load average {load_before:.1f} at start,"
              f" {os.getloadavg()[0]:.1f} at end")
    print(projection_report.render(results, header))
    if args.json is not None:
        meta = {"suite": "m2", "quick": args.quick, "events": cfg.events, "source": source, "cores": os.cpu_count(),
                "python": platform.python_version(), "wall_seconds": round(time.perf_counter() - began, 1),
                "time": time.time(), "loadavg_start": load_before, "loadavg_end": os.getloadavg()[0]}
        args.json.write_text(json.dumps(projection_report.as_json(results, meta, projection.to_jsonable), indent=2, default=str) + "\n")
    return 0


def _run_m3(args: argparse.Namespace) -> int:
    """The M3 suite (bench/subscribe.py): its own table and JSON."""
    from bench import subscribe, subscribe_report

    cfg = subscribe.subscribe_config(args.quick, args.m3_events, args.m3_subscriptions,
                       _steps(args.m3_steps, subscribe.STEPS, "--m3-steps"))
    began = time.perf_counter()
    load_before = os.getloadavg()[0]
    with bench_servers() as servers:
        source = "private servers" if servers.private else "servers from PAMLEDGER_NATS_URL/PAMLEDGER_DATABASE_URL"
        subscribe.log(f"{source}; catch-up {cfg.events:,} events; live {cfg.live_rate:g}/s for {cfg.live_seconds:g} s;"
               f" fan-out {cfg.fan_scopes * cfg.fan_per_scope} subscriptions, {cfg.fan_rate:g}/s for {cfg.fan_seconds:g} s")
        results = subscribe.run_suite(servers, cfg)
    header = (f"pamledger bench --m3{' --quick' if args.quick else ''}: {os.cpu_count()} cores; {source};"
              f" {time.perf_counter() - began:.0f} s wall; 1-min load average {load_before:.1f} at start,"
              f" {os.getloadavg()[0]:.1f} at end")
    print(subscribe_report.render(results, header))
    if args.json is not None:
        meta = {"suite": "m3", "quick": args.quick, "config": vars(cfg), "source": source, "cores": os.cpu_count(),
                "python": platform.python_version(), "wall_seconds": round(time.perf_counter() - began, 1),
                "time": time.time(), "loadavg_start": load_before, "loadavg_end": os.getloadavg()[0]}
        args.json.write_text(json.dumps(subscribe_report.as_json(results, meta, subscribe.to_jsonable), indent=2, default=str) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
