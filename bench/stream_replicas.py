"""`python -m bench stream_replicas`: what an R3 ledger stream on a 3-node cluster costs the relay.

The relay (command_handler.relay) publishes committed ledger rows in runs, each run with one
acknowledgement: long runs when it catches up or the writer is busy, runs of one when writes trickle in.
This drives the relay's own publish path (`Relay._publish`, msg-id and expected-last-sequence headers)
with synthetic rows, no Postgres, against three streams measured in the same run:

  r1_single   R1 on one nats-server: today's default, the baseline
  r1_cluster  R1 on a 3-node cluster (the stream lives on one node; the connection may be on another)
  r3_cluster  R3 on the same cluster: every acknowledgement waits for a quorum (2 of 3) to store the run

For each: events/s in runs of `--run` rows (the catch-up and busy path), and the acknowledgement latency
of runs of one row (the trickle path), p50 and p99. Ratios against r1_single are printed.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import tempfile
import time
import uuid
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from command_handler.relay import Relay, ensure_stream
from infra.ledger import LedgerRow
from infra.nats_raw import connect_raw
from infra.nats_servers import StreamReplicas
from local_servers.launch import free_port
from local_servers.nats_cluster import cluster_url, start_cluster
from local_servers.nats_server import NatsServer, launch_nats

EVENT = json.dumps({"event_type": "object_created", "content": {"statement": "x" * 300}}).encode()


def rows(start: int, count: int) -> list[LedgerRow]:
    """`count` ledger rows from sequence `start`, the size of a small create's event."""
    now = datetime.now(timezone.utc)
    return [LedgerRow(ledger_sequence=seq, event_id=f"evt:{uuid.uuid4()}", operation_id=f"op:{seq}",
                      scope_id="workspace:bench", object_id=f"obj:{seq}", version_id=f"ver:{seq}",
                      event_type="object_created", recorded_at=now, event=EVENT, prev_hash=b"\0" * 32,
                      row_hash=b"\1" * 32) for seq in range(start, start + count)]


async def measure(url: str, replicas: int, events: int, run: int, singles: int) -> dict[str, Any]:
    """Publish `events` rows in runs of `run`, then `singles` runs of one row; rates and ack latencies."""
    nc = await connect_raw(url, name="bench-stream-replicas")
    stream = f"BENCH_R{replicas}_{uuid.uuid4().hex[:6]}".upper()
    prefix = f"benchr{uuid.uuid4().hex[:6]}"
    try:
        relay = Relay(nc, "", stream, prefix, 0, publish_timeout=30.0, replicas=StreamReplicas(replicas, exact=True))
        await ensure_stream(relay.js, stream, prefix, None, StreamReplicas(replicas, exact=True))
        await relay._publish(rows(1, run))  # warm-up: connections, the stream's first block
        sequence = run + 1
        started = time.perf_counter()
        for first in range(sequence, sequence + events, run):
            await relay._publish(rows(first, run))
        rate = events / (time.perf_counter() - started)
        sequence += events
        latencies = []
        for seq in range(sequence, sequence + singles):
            batch = rows(seq, 1)
            began = time.perf_counter()
            await relay._publish(batch)
            latencies.append((time.perf_counter() - began) * 1000)
        info = await relay.js.stream_info(stream)
        assert info.state.last_seq == sequence + singles - 1, "the stream lost a message"
        await relay.js.delete_stream(stream)
    finally:
        await nc.close()
    quantiles = statistics.quantiles(latencies, n=100)
    return {"events_per_s": rate, "ack_p50_ms": statistics.median(latencies), "ack_p99_ms": quantiles[98]}


def report(results: dict[str, dict[str, Any]]) -> str:
    base = results["r1_single"]
    lines = [f"{'stream':<12} {'events/s':>10} {'ratio':>6} {'ack p50 ms':>11} {'ratio':>6}"
             f" {'ack p99 ms':>11} {'ratio':>6}"]
    for name, r in results.items():
        lines.append(f"{name:<12} {r['events_per_s']:>10.0f} {r['events_per_s'] / base['events_per_s']:>6.2f}"
                     f" {r['ack_p50_ms']:>11.3f} {r['ack_p50_ms'] / base['ack_p50_ms']:>6.2f}"
                     f" {r['ack_p99_ms']:>11.3f} {r['ack_p99_ms'] / base['ack_p99_ms']:>6.2f}")
    return "\n".join(lines)


async def run_all(args: argparse.Namespace, single: NatsServer, cluster: list[NatsServer]) -> dict[str, Any]:
    results: dict[str, Any] = {}
    for _ in range(args.rounds):  # alternate, so drift on a shared machine hits every stream alike
        for name, url, replicas in (("r1_single", single.url, 1), ("r1_cluster", cluster_url(cluster), 1),
                                    ("r3_cluster", cluster_url(cluster), 3)):
            measured = await measure(url, replicas, args.events, args.run, args.singles)
            results.setdefault(name, []).append(measured)
    return {name: {key: statistics.median(m[key] for m in runs) for key in runs[0]} for name, runs in results.items()}


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench stream_replicas", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--events", type=int, default=50_000, help="rows published in runs (default 50000)")
    parser.add_argument("--run", type=int, default=200, help="rows per run, one ack each (default 200)")
    parser.add_argument("--singles", type=int, default=2000, help="runs of one row timed one by one (default 2000)")
    parser.add_argument("--rounds", type=int, default=3, help="rounds over the three streams; medians (default 3)")
    parser.add_argument("--quick", action="store_true", help="10000 events, 500 singles, 1 round")
    parser.add_argument("--json", type=Path, help="also write the figures as JSON")
    args = parser.parse_args(argv)
    if args.quick:
        args.events, args.singles, args.rounds = 10_000, 500, 1
    with tempfile.TemporaryDirectory(prefix="bench-replicas-") as root:
        single = launch_nats(Path(root) / "single", free_port())
        cluster: list[NatsServer] = []
        try:
            cluster = start_cluster(Path(root) / "cluster", 3, free_port)
            results = asyncio.run(run_all(args, single, cluster))
        finally:
            for server in [single, *cluster]:
                server.stop()
    print(f"relay publish, runs of {args.run} and of 1, medians of {args.rounds} round(s):")
    print(report(results))
    if args.json:
        args.json.write_text(json.dumps(results, indent=2) + "\n")
    return 0
