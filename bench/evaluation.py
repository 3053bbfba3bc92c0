"""`python -m bench evaluation`: sealing a snapshot and Query at a snapshot on a loaded scope, baselines in one run.

One scope of N objects with several versions each (bench.ledger_loader: creates, then updates and validation
transitions of the same objects) is COPYed into a fresh database, projected (replay --swap) and served by the
real service (bench.projection_service.service_on). Then, over NATS, one request in flight:
1. seal: `snapshot_create` of the whole scope at the head, vs a `create` of one object and a NATS echo round
   trip (the issue's target: 50 ms at 100k objects, no copy of rows or vectors);
2. query: the same structured queries live and at the sealed snapshot, alternating request by request, p50 of
   each and their ratio (target: at most 1.5x the live query).
The database is dropped and the service stopped at the end, also on error or Ctrl-C.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import statistics
import sys
import time
import uuid
from collections.abc import Callable
from typing import Any

import msgspec
from nats.aio.client import Client as NATS

from bench.cli import interruptible
from bench.ledger_loader import LoadSpec, load_ledger, scope_ids
from bench.load import ACTOR, PROVENANCE, REQUEST_TIMEOUT, check_result
from bench.projection_query import structured_maker
from bench.projection_replay import build_projection
from bench.projection_service import service_on
from bench.servers import Servers, bench_servers
from bench.service import serial_echo
from pamledger_client.protocol.subjects import command_subject, query_subject

SEAL_TARGET_MS = 50.0
QUERY_RATIO_TARGET = 1.5


def log(text: str) -> None:
    print(f"bench evaluation: {text}", file=sys.stderr, flush=True)


async def _timed(nc: NATS, subject: str, body: dict[str, Any]) -> tuple[float, bytes]:
    payload = msgspec.json.encode(body)
    t0 = time.perf_counter()
    msg = await nc.request(subject, payload, timeout=REQUEST_TIMEOUT)
    seconds = time.perf_counter() - t0
    check_result(msg.data, payload)
    return seconds, msg.data


def _ms(samples: list[float], q: float = 0.5) -> float:
    if not samples:
        return float("nan")
    ordered = sorted(samples)
    return round(ordered[min(len(ordered) - 1, int(q * len(ordered)))] * 1e3, 3)


async def seal_step(nc: NATS, prefix: str, scope: str, rounds: int) -> dict[str, Any]:
    """snapshot_create at the head vs a create in the same scope, interleaved."""
    seals: list[float] = []
    creates: list[float] = []
    snapshot_id = ""
    for i in range(rounds):
        snapshot_id = f"snap:bench:{uuid.uuid4().hex[:12]}"
        seconds, _ = await _timed(nc, command_subject(prefix, "snapshot_create"),
                                  {"scope_id": scope, "actor": ACTOR, "snapshot": {"snapshot_id": snapshot_id}})
        seals.append(seconds)
        seconds, _ = await _timed(nc, command_subject(prefix, "create"), {
            "scope_id": scope, "object_type": "observation", "actor": ACTOR, "provenance": PROVENANCE,
            "canonical_content": {"observation": f"bench evaluation probe {i}"}})
        creates.append(seconds)
    return {"seal_p50_ms": _ms(seals), "seal_p99_ms": _ms(seals, 0.99), "create_p50_ms": _ms(creates),
            "seal_vs_create": round(_ms(seals) / _ms(creates), 2), "rounds": rounds, "last_snapshot_id": snapshot_id}


async def query_step(nc: NATS, prefix: str, make: Callable[[], tuple[str, dict[str, Any]]], snapshot_id: str,
                     seconds: float) -> dict[str, Any]:
    """The same request live and at the snapshot, alternating (which goes first alternates too)."""
    subject = query_subject(prefix, "query")
    live: list[float] = []
    pinned: list[float] = []
    by_variant: dict[str, tuple[list[float], list[float]]] = {}
    end = time.perf_counter() + seconds
    turn = 0
    while time.perf_counter() < end:
        variant, request = make()
        runs = [("live", request), ("snapshot", {**request, "snapshot_id": snapshot_id})]
        if turn % 2:
            runs.reverse()
        turn += 1
        for kind, body in runs:
            took, _ = await _timed(nc, subject, body)
            (live if kind == "live" else pinned).append(took)
            pair = by_variant.setdefault(variant, ([], []))
            (pair[0] if kind == "live" else pair[1]).append(took)
    variants = {v: {"n": len(a), "live_p50_ms": _ms(a), "snapshot_p50_ms": _ms(b),
                    "ratio": round(statistics.median(b) / statistics.median(a), 2)} for v, (a, b) in by_variant.items()}
    return {"pairs": len(live), "live_p50_ms": _ms(live), "snapshot_p50_ms": _ms(pinned),
            "live_p99_ms": _ms(live, 0.99), "snapshot_p99_ms": _ms(pinned, 0.99),
            "ratio_p50": round(statistics.median(pinned) / statistics.median(live), 2), "variants": variants}


async def _service_steps(servers: Servers, url: str, load: dict[str, Any], args: argparse.Namespace
                         ) -> dict[str, Any]:
    scope = scope_ids(1)[0]
    out: dict[str, Any] = {}
    async with service_on(servers, url, int(load["head_sequence"]), "e1",
                          answering=("writer", "query", "projector")) as (nc, prefix, _child):
        log(f"seal: {args.seals} snapshot_create at the head, interleaved with creates")
        out["seal"] = await seal_step(nc, prefix, scope, args.seals)
        make = structured_maker([scope], load["clock_start"], load["clock_end"], random.Random(11))
        log(f"query: live vs at the snapshot, {args.query_seconds:g} s of pairs")
        await query_step(nc, prefix, make, out["seal"]["last_snapshot_id"], 1.0)  # warm both plans
        out["query"] = await query_step(nc, prefix, make, out["seal"]["last_snapshot_id"], args.query_seconds)
    out["echo"] = (await serial_echo(servers, "e1echo", b"{}", 2.0)).summary()
    return out


def _render(out: dict[str, Any], header: str) -> str:
    seal, query = out["seal"], out["query"]
    echo_p50 = round(out["echo"]["p50_ms"], 3)
    lines = [header, "",
             f"seal   snapshot_create p50 {seal['seal_p50_ms']} ms (p99 {seal['seal_p99_ms']} ms) vs create p50"
             f" {seal['create_p50_ms']} ms ({seal['seal_vs_create']}x), NATS echo p50 {echo_p50} ms;"
             f" target <= {SEAL_TARGET_MS:g} ms: {'met' if seal['seal_p50_ms'] <= SEAL_TARGET_MS else 'MISSED'}",
             f"query  at snapshot p50 {query['snapshot_p50_ms']} ms vs live p50 {query['live_p50_ms']} ms:"
             f" {query['ratio_p50']}x over {query['pairs']} pairs; target <= {QUERY_RATIO_TARGET:g}x:"
             f" {'met' if query['ratio_p50'] <= QUERY_RATIO_TARGET else 'MISSED'}"]
    for variant, row in sorted(query["variants"].items()):
        lines.append(f"         {variant:<34} n={row['n']:<5} live {row['live_p50_ms']:>8} ms  snapshot"
                     f" {row['snapshot_p50_ms']:>8} ms  {row['ratio']}x")
    return "\n".join(lines)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench evaluation", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--objects", type=int, default=100_000, help="objects in the scope (default 100000)")
    parser.add_argument("--versions", type=int, choices=(1, 2, 3), default=3,
                        help="versions per object: 1 creates only, 2 adds an update, 3 a transition too (default 3)")
    parser.add_argument("--seals", type=int, default=30, help="snapshot_create requests (default 30)")
    parser.add_argument("--query-seconds", type=float, default=10.0, help="seconds of live/snapshot pairs")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    return interruptible(lambda: _run(args))


def _run(args: argparse.Namespace) -> int:
    began = time.perf_counter()
    load_before = os.getloadavg()[0]
    follow_ups = args.versions - 1
    spec = LoadSpec(events=args.objects * args.versions, scopes=1, update_share=1.0 if follow_ups >= 1 else 0.0,
                    transition_share=1.0 if follow_ups >= 2 else 0.0)
    with bench_servers() as servers:
        db_name, url = servers.fresh_database("e1", migrated=False)
        try:
            log(f"loader: {spec.events:,} events (~{args.objects:,} objects x {args.versions} versions, one scope)")
            load = load_ledger(url, spec, lambda note: None)
            asyncio.run(build_projection(url, log))
            out = asyncio.run(_service_steps(servers, url, load, args))
        finally:
            servers.drop_database(db_name)
    header = (f"pamledger bench evaluation: {load['events']:,} events, {load['objects']:,} objects in one scope;"
              f" {os.cpu_count()} cores; {time.perf_counter() - began:.0f} s wall; 1-min load average"
              f" {load_before:.1f} at start, {os.getloadavg()[0]:.1f} at end")
    print(_render(out, header))
    return 0
