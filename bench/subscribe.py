"""`python -m bench subscribe`: Subscribe on private servers, baselines in the same run.

1. catch-up: a bulk-loaded one-scope ledger, replicated by the service's relay; one SDK subscriber from
   after_sequence=0 vs a raw JetStream pull consumer on the same stream and subject
   (bench.subscribe_catchup).
2. live: one SDK push subscriber, 1,000 creates/s open loop; reply -> delivered p50/p99, split at the
   relay's publish; NATS echo round trip as the floor; the same at 100/s as a light-load reference
   (bench.subscribe_live).
3. fan-out: 1,000 push subscriptions (100 scopes x 10) on one gateway, 1,000 creates/s over the
   scopes; every delivery checked, lag per third of the window (bench.subscribe_fanout).
Every database is dropped, every service stopped and every stream deleted at the end, also on error or
Ctrl-C. Each step also records how much CPU other processes on the machine used meanwhile: the
numbers are only comparable on an otherwise idle machine.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil  # type: ignore[import-untyped]

from bench.cli import interruptible, parse_steps
from bench.load import Result
from bench.servers import Servers, bench_servers
from bench.subscribe_catchup import catchup_benchmark
from bench.subscribe_fanout import fanout_benchmark
from bench.subscribe_live import live_benchmark
from bench.subscribe_report import as_json, render
from bench.subscribe_service import listener_pid


@dataclass(frozen=True)
class SubscribeConfig:
    events: int
    live_rate: float
    light_rate: float
    live_seconds: float
    warmup: float
    fan_scopes: int
    fan_per_scope: int
    fan_rate: float
    fan_seconds: float
    steps: tuple[str, ...] = ("catchup", "live", "light", "fanout")


STEPS = ("catchup", "live", "light", "fanout")


def subscribe_config(quick: bool, events: int | None = None, subscriptions: int | None = None,
              steps: tuple[str, ...] = STEPS) -> SubscribeConfig:
    """Full: 200k events, 15 s live, 1,000 subscriptions; quick: 20k events, 5 s, 200 subscriptions."""
    subs = subscriptions or (200 if quick else 1000)
    return SubscribeConfig(events=events or (20_000 if quick else 200_000), live_rate=1000.0, light_rate=100.0,
                    live_seconds=5.0 if quick else 15.0, warmup=1.0 if quick else 2.0,
                    fan_scopes=max(1, subs // 10), fan_per_scope=10, fan_rate=1000.0,
                    fan_seconds=5.0 if quick else 15.0, steps=steps)


def log(text: str) -> None:
    print(f"bench subscribe: {text}", file=sys.stderr, flush=True)


class ForeignLoad:
    """CPU used by processes outside this benchmark's process tree (another run, a build) during a step."""

    def __init__(self, roots: tuple[int, ...] = ()) -> None:
        self.roots = roots
        self.t0 = time.monotonic()
        self.before = self._foreign()

    def _foreign(self) -> dict[int, float]:
        mine: set[int] = set()
        for pid in (os.getpid(), *self.roots):
            try:
                root = psutil.Process(pid)
                mine |= {root.pid, *(c.pid for c in root.children(recursive=True))}
            except psutil.Error:
                continue
        out: dict[int, float] = {}
        for proc in psutil.process_iter():
            if proc.pid in mine:
                continue
            try:
                times = proc.cpu_times()
                out[proc.pid] = times.user + times.system
            except (psutil.Error, OSError):
                continue
        return out

    def cores(self) -> float:
        after = self._foreign()
        used = sum(v - self.before.get(pid, 0.0) for pid, v in after.items())
        return round(used / max(time.monotonic() - self.t0, 1e-6), 2)


def _step(out: dict[str, Any], name: str, run: Callable[[], dict[str, Any]], roots: tuple[int, ...]) -> None:
    foreign = ForeignLoad(roots)
    t0 = time.perf_counter()
    out[name] = run()
    out[name]["step_seconds"] = round(time.perf_counter() - t0, 1)
    out[name]["other_processes_cores"] = foreign.cores()
    if out[name]["other_processes_cores"] > 0.2:
        log(f"WARNING: other processes used {out[name]['other_processes_cores']} cores during {name};"
            " its numbers are not those of an idle machine")


def run_suite(servers: Servers, cfg: SubscribeConfig) -> dict[str, Any]:
    """Run the three benchmarks; returns their raw results (see bench.subscribe_report for the table)."""
    out: dict[str, Any] = {"cores": os.cpu_count()}
    postgres = listener_pid(servers.admin_url) if servers.private else None
    roots = (postgres,) if postgres else ()
    steps = {
        "catchup": lambda: catchup_benchmark(servers, cfg.events, log),
        "live": lambda: asyncio.run(live_benchmark(servers, cfg.live_rate, cfg.warmup, cfg.live_seconds, log)),
        "light": lambda: asyncio.run(live_benchmark(servers, cfg.light_rate, cfg.warmup,
                                                    min(cfg.live_seconds, 5.0), log, echo=False)),
        "fanout": lambda: asyncio.run(fanout_benchmark(servers, cfg.fan_scopes, cfg.fan_per_scope,
                                                       cfg.fan_rate, cfg.warmup, cfg.fan_seconds, log)),
    }
    for name in cfg.steps:
        _step(out, name, steps[name], roots)
    return out


def to_jsonable(value: Any) -> Any:
    """Results (bench.load.Result) become their summaries; NaN becomes None; everything else as is."""
    if isinstance(value, Result):
        return to_jsonable(value.summary())
    if isinstance(value, dict):
        return {k: to_jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [to_jsonable(v) for v in value]
    if isinstance(value, float) and value != value:
        return None
    return value


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench subscribe", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="20k events, 5 s live, 200 subscriptions")
    parser.add_argument("--events", type=int, default=None,
                        help="catch-up ledger events (default 200000; 20000 with --quick)")
    parser.add_argument("--subscriptions", type=int, default=None,
                        help="fan-out subscriptions, 10 per scope (default 1000; 200 with --quick)")
    parser.add_argument("--steps", default=",".join(STEPS),
                        help="comma-separated subset of catchup,live,light,fanout (default all four)")
    parser.add_argument("--json", type=Path, default=None, help="also write every number and verdict here")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    cfg = subscribe_config(args.quick, args.events, args.subscriptions, parse_steps(args.steps, STEPS, "--steps"))
    return interruptible(lambda: _run(args, cfg))


def _run(args: argparse.Namespace, cfg: SubscribeConfig) -> int:
    began = time.perf_counter()
    load_before = os.getloadavg()[0]
    with bench_servers() as servers:
        source = "private servers" if servers.private else "servers from PAMLEDGER_NATS_URL/PAMLEDGER_DATABASE_URL"
        log(f"{source}; catch-up {cfg.events:,} events; live {cfg.live_rate:g}/s for {cfg.live_seconds:g} s;"
            f" fan-out {cfg.fan_scopes * cfg.fan_per_scope} subscriptions, {cfg.fan_rate:g}/s for"
            f" {cfg.fan_seconds:g} s")
        results = run_suite(servers, cfg)
    header = (f"pamledger bench subscribe{' --quick' if args.quick else ''}: {os.cpu_count()} cores; {source};"
              f" {time.perf_counter() - began:.0f} s wall; 1-min load average {load_before:.1f} at start,"
              f" {os.getloadavg()[0]:.1f} at end")
    print(render(results, header))
    if args.json is not None:
        meta = {"suite": "subscribe", "quick": args.quick, "config": vars(cfg), "source": source,
                "cores": os.cpu_count(), "python": platform.python_version(),
                "wall_seconds": round(time.perf_counter() - began, 1), "time": time.time(),
                "loadavg_start": load_before, "loadavg_end": os.getloadavg()[0]}
        args.json.write_text(json.dumps(as_json(results, meta, to_jsonable), indent=2, default=str) + "\n")
    return 0
