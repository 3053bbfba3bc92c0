"""Query latency with the query role reading a streaming replica vs reading the primary, same data, same run.

One writer+projector process fills a scope; then query-only processes (`pamledger serve --roles query`) take
turns: one reading the primary (no read_urls, today's path), one reading a local replica (database.read_urls;
every request passes the fence: the primary's WAL position, then the replica's replay of it). Each turn sends
the same serial queries (a structured page and a full-text page, each with min_sequence = the ledger head,
as the SDK sends after a write); turns alternate, so drift hits both. Printed: p50 and p95 per kind and
source, the ratio replica / primary, and where the replica turns' requests were answered (status).

The replica is `local_servers.postgres_server.launch_replica` on the bench's private Postgres (as
`pamledger up --pg-replica` starts it); with env URLs (PAMLEDGER_NATS_URL / PAMLEDGER_DATABASE_URL) there is
no local primary to copy, so this bench refuses them.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from pathlib import Path
from typing import Any

from psycopg.conninfo import conninfo_to_dict, make_conninfo

from bench.load import ACTOR, PROVENANCE, check_result, drive_count
from bench.procs import Child, python_child, wait_answering
from bench.search_report import percentile
from bench.servers import Servers, bench_servers
from bench.service import service_process
from pamledger_client.protocol.subjects import command_subject, query_subject, status_subject
from local_servers.launch import free_port
from local_servers.postgres_server import PostgresServer, launch_replica

WORDS = ("harbor", "ledger", "granite", "meadow", "signal", "copper", "orchard", "lantern", "summit", "river")


def log(message: str) -> None:
    print(f"[replica_reads] {message}", file=sys.stderr, flush=True)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench replica_reads", description=__doc__.splitlines()[0])
    parser.add_argument("--objects", type=int, default=5000, help="objects in the queried scope")
    parser.add_argument("--queries", type=int, default=400, help="queries of each kind per turn")
    parser.add_argument("--turns", type=int, default=3, help="turns of each source, alternating")
    parser.add_argument("--write-rate", type=float, default=200.0,
                        help="creates/s into another scope during a second set of turns (0: idle turns only)")
    parser.add_argument("--quick", action="store_true", help="1,000 objects, 100 queries, 2 turns")
    parser.add_argument("--json", type=Path, help="also write every number here")
    args = parser.parse_args(argv)
    if args.quick:
        args.objects, args.queries, args.turns = 1000, 100, 2
    return args


def _text(i: int) -> str:
    return " ".join(WORDS[(i * k) % len(WORDS)] for k in (1, 3, 7)) + f" note {i}"


async def fill(nc: Any, prefix: str, scope: str, count: int) -> int:
    """The scope and `count` claims through the writer, 64 in flight; returns the last ledger sequence."""
    reply = await nc.request(command_subject(prefix, "create_scope"),
                             json.dumps({"scope_id": scope, "scope_kind": "workspace"}).encode(), timeout=30)
    check_result(reply.data, b"")
    last = [0]

    def make(i: int) -> tuple[bytes, dict[str, str] | None]:
        body = {"scope_id": scope, "object_type": "claim", "canonical_content": {"text": _text(i)},
                "actor": ACTOR, "provenance": PROVENANCE}
        return json.dumps(body).encode(), {"Pam-Idempotency-Key": f"replica-bench-{i}"}

    def check(data: bytes, request: bytes) -> None:
        check_result(data, request)
        last[0] = max(last[0], int(json.loads(data)["result"]["ledger_sequence"]))

    await drive_count(nc, command_subject(prefix, "create"), "fill", make, check, 64, count, {})
    return last[0]


async def timed(nc: Any, subject: str, body: bytes, count: int) -> list[float]:
    """`count` serial requests (after 20 unrecorded), each checked; their latencies in ms."""
    times: list[float] = []
    for i in range(count + 20):
        t0 = time.perf_counter()
        reply = await nc.request(subject, body, timeout=30)
        elapsed = (time.perf_counter() - t0) * 1000
        found = json.loads(reply.data)
        if "result" not in found or found["result"].get("min_sequence_reached") is not True:
            raise RuntimeError(f"query failed or stale: {reply.data[:300]!r}")
        if i >= 20:
            times.append(elapsed)
    return times


def query_child(servers: Servers, database_url: str, prefix: str, read_urls: list[str], name: str) -> Child:
    env = {"PAMLEDGER_NATS_URL": servers.nats_url, "PAMLEDGER_DATABASE_URL": database_url,
           "PAMLEDGER_SUBJECT_PREFIX": prefix, "PAMLEDGER_LOG_FORMAT": "json", "PAMLEDGER_AUTH__MODE": "off",
           "PAMLEDGER_METRICS__PORT": "0", "PAMLEDGER_STATE_DIR": str(servers.work_dir / f"state-{name}"),
           "PAMLEDGER_DATABASE__READ_URLS": json.dumps(read_urls)}
    return python_child(name, "pamledger", env, servers.work_dir, "serve", "--roles", "query")


async def turn(servers: Servers, database_url: str, prefix: str, read_urls: list[str], name: str,
               queries: dict[str, bytes], count: int) -> tuple[dict[str, list[float]], dict[str, Any]]:
    """One query-only process's measured queries, and its status (where it read)."""
    child = query_child(servers, database_url, prefix, read_urls, name)
    child.start()
    from bench.service import connect

    nc = await connect(servers.nats_url, f"bench-{name}")
    try:
        status = status_subject(prefix, "query")
        await wait_answering(nc, child, status, timeout=60)
        if read_urls:  # the replica serving (its prober answered) before anything is measured
            deadline = time.monotonic() + 30
            while json.loads((await nc.request(status, b"{}", timeout=5)).data)["result"]["database"][
                    "replicas"][0]["state"] != "serving":
                if time.monotonic() > deadline:
                    raise RuntimeError("the replica never served")
                await asyncio.sleep(0.05)
        found = {kind: await timed(nc, query_subject(prefix, "query"), body, count) for kind, body in queries.items()}
        details = json.loads((await nc.request(status, b"{}", timeout=5)).data)["result"].get("database", {})
        return found, details
    finally:
        await nc.close()
        child.stop()


async def run(args: argparse.Namespace) -> dict[str, Any]:
    with bench_servers() as servers:
        if not servers.private:
            raise SystemExit("replica_reads needs the bench's private Postgres to copy a replica from: unset "
                             "PAMLEDGER_NATS_URL / PAMLEDGER_DATABASE_URL")
        primary_port = int(str(conninfo_to_dict(servers.admin_url)["port"]))
        replica: PostgresServer = launch_replica(primary_port, servers.work_dir / "replica", free_port())
        try:
            return await measure(args, servers, replica)
        finally:
            replica.destroy()


async def measure(args: argparse.Namespace, servers: Servers, replica: PostgresServer) -> dict[str, Any]:
    name, database_url = servers.fresh_database("replica")
    read_url = make_conninfo(replica.url, dbname=name)
    scope = "scope:bench:replica"
    async with service_process(servers, database_url, "replica", roles="writer,projector",
                               answering=("writer", "projector")) as (nc, prefix, _stream, _child):
        log(f"filling {args.objects} objects")
        head = await fill(nc, prefix, scope, args.objects)
        queries = {
            "structured": json.dumps({"scope_id": scope, "validation_states": ["unverified"], "limit": 20,
                                      "min_sequence": head}).encode(),
            "full_text": json.dumps({"scope_id": scope, "validation_states": ["unverified"], "limit": 20,
                                     "text": "granite lantern", "min_sequence": head}).encode(),
        }
        phases: dict[str, Any] = {}
        for rate in (0.0, args.write_rate) if args.write_rate > 0 else (0.0,):
            writes = asyncio.create_task(write_steadily(nc, prefix, rate)) if rate else None
            try:
                times, reads = await turns(args, servers, database_url, prefix, read_url, queries)
            finally:
                if writes is not None:
                    writes.cancel()
            written = await writes if writes is not None else 0
            phases["idle" if not rate else f"{rate:g} creates/s"] = {**report(times, reads), "creates": written}
        fence = await fence_alone(database_url, read_url, args.queries * 2)
    return {"objects": args.objects, "queries_per_turn": args.queries, "turns": args.turns, "phases": phases,
            "fence_p50_ms": percentile(fence, 50), "fence_p95_ms": percentile(fence, 95)}


async def turns(args: argparse.Namespace, servers: Servers, database_url: str, prefix: str, read_url: str,
                queries: dict[str, bytes]) -> tuple[dict[str, dict[str, list[float]]], list[dict[str, Any]]]:
    """Alternating turns of a query process on the primary and one on the replica: latencies, replica status."""
    times: dict[str, dict[str, list[float]]] = {"primary": {}, "replica": {}}
    reads: list[dict[str, Any]] = []
    for n in range(args.turns):
        for source, urls in (("primary", []), ("replica", [read_url])):
            log(f"turn {n + 1}/{args.turns}: {source}")
            found, details = await turn(servers, database_url, prefix, urls, f"query-{source}-{n}", queries,
                                        args.queries)
            for kind, values in found.items():
                times[source].setdefault(kind, []).extend(values)
            if source == "replica":
                reads.append(details)
    return times, reads


async def write_steadily(nc: Any, prefix: str, rate: float) -> int:
    """Creates into a scope of their own at about `rate` per second until cancelled; returns how many."""
    scope = "scope:bench:replica-writes"
    check_result((await nc.request(command_subject(prefix, "create_scope"), json.dumps(
        {"scope_id": scope, "scope_kind": "workspace"}).encode(), timeout=30)).data, b"")
    done, started = 0, time.monotonic()
    try:
        while True:
            body = {"scope_id": scope, "object_type": "claim", "canonical_content": {"text": _text(done)},
                    "actor": ACTOR, "provenance": PROVENANCE}
            check_result((await nc.request(command_subject(prefix, "create"), json.dumps(body).encode(),
                                           timeout=30)).data, b"")
            done += 1
            await asyncio.sleep(max(0.0, started + done / rate - time.monotonic()))
    except asyncio.CancelledError:
        return done


async def fence_alone(primary_url: str, replica_url: str, count: int) -> list[float]:
    """The fence by itself, in this process: the primary's position read, then the replica's replay checked
    (what a replica read adds to a primary read), serial, in ms."""
    from psycopg_pool import AsyncConnectionPool

    from query.replica_fence import PrimaryPosition, replay_gap

    times: list[float] = []
    async with AsyncConnectionPool(primary_url, min_size=1, max_size=1, kwargs={"autocommit": True}) as primary, \
            AsyncConnectionPool(replica_url, min_size=1, max_size=1, kwargs={"autocommit": True}) as replica:
        position = PrimaryPosition(primary)
        for i in range(count + 20):
            t0 = time.perf_counter()
            target = await position.read()
            async with replica.connection() as conn:
                if await replay_gap(conn, target, 5.0):
                    raise RuntimeError("the replica did not replay the primary's position within 5 s")
            if i >= 20:
                times.append((time.perf_counter() - t0) * 1000)
    return times


def report(times: dict[str, dict[str, list[float]]], reads: list[dict[str, Any]]) -> dict[str, Any]:
    rows = {}
    for kind in times["primary"]:
        primary, replica = times["primary"][kind], times["replica"][kind]
        rows[kind] = {"primary_p50_ms": percentile(primary, 50), "replica_p50_ms": percentile(replica, 50),
                      "primary_p95_ms": percentile(primary, 95), "replica_p95_ms": percentile(replica, 95)}
        rows[kind]["ratio_p50"] = rows[kind]["replica_p50_ms"] / rows[kind]["primary_p50_ms"]
    replica_reads = sum(r["replicas"][0]["reads"] for r in reads)
    primary_reads = sum(r["primary_reads"] for r in reads)
    return {"kinds": rows, "replica_turns_read": {"replica": replica_reads, "primary": primary_reads}}


def render(out: dict[str, Any]) -> str:
    lines = [f"query through the service, {out['objects']} objects, {out['queries_per_turn']} serial queries "
             f"per kind and turn, {out['turns']} turns per source (ms)",
             f"{'phase':<20}{'kind':<12}{'primary p50':>13}{'replica p50':>13}{'ratio':>8}{'primary p95':>13}"
             f"{'replica p95':>13}  replica / primary answered"]
    for phase, found in out["phases"].items():
        where = found["replica_turns_read"]
        for kind, row in found["kinds"].items():
            lines.append(f"{phase:<20}{kind:<12}{row['primary_p50_ms']:>13.2f}{row['replica_p50_ms']:>13.2f}"
                         f"{row['ratio_p50']:>8.2f}{row['primary_p95_ms']:>13.2f}{row['replica_p95_ms']:>13.2f}"
                         f"  {where['replica']} / {where['primary']}")
    lines.append(f"the fence alone (primary position + replica replay check, in-process): p50 "
                 f"{out['fence_p50_ms']:.2f} ms, p95 {out['fence_p95_ms']:.2f} ms")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    out = asyncio.run(run(args))
    print(render(out))
    if args.json:
        args.json.write_text(json.dumps(out, indent=2))
    return 0
