"""`python -m bench snapshot`: answers at a sealed evaluation snapshot vs the same live answers ([E1], issue 27).

How: private servers, a fresh database, the service as a process with every role (the real indexer, in the
feature-hashing space `hashing-384`: no model to load, so the run measures search, not embedding). One
scope of N claims is created through the writer (64 in flight), then every claim is updated twice (3
versions each); the run waits for the projection and the indexer to reach the head and seals a snapshot of
the scope there (nothing is written afterwards, so live and snapshot answer the same state).

Measured, serial requests through NATS after a warm-up, live and snapshot alternating:
- query (newest first, limit 10): p50 at the snapshot / p50 live (target <= 1.5);
- semantic search by text (limit 10): p50 ratio likewise (target <= 1.5), and recall@10 of both against the
  exact top-10 of the live vector table (SQL, no index scan), which at seal time holds the same versions'
  vectors (target: the snapshot's recall equal to the live one's);
- storage: rows and pg_total_relation_size of the kept-vector table (every version's vector) beside the
  live one (one per object, with its HNSW index), at N objects x 3 versions.
Default N is small (2,000); `--objects 100000` is the issue's size (creating 300,000 versions takes a while).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time
from typing import Any

import msgspec
import psycopg
from psycopg import sql

from bench.embedding import corpus
from bench.indexing import Bench, create_all, wait_until
from bench.load import ACTOR, PROVENANCE, check_result, drive_count
from bench.search_report import percentile
from bench.search_service_load import make_scopes
from bench.servers import bench_servers
from bench.service import connect
from embedding.known import descriptor_for, embedder_for
from embedding.store import find_space, vector_literal
from embedding.text_profile import clean
from pamledger_client.protocol.subjects import command_subject, query_subject

SCOPE = "workspace:bench-snapshot"
MODEL = "hashing-384"
K = 10
UNVERIFIED = {"validation_states": ["unverified"]}  # claims are created unverified; the default hides them


def log(message: str) -> None:
    print(f"bench snapshot: {message}", file=sys.stderr, flush=True)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench snapshot", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--objects", type=int, default=2_000, help="claims, each with 3 versions (default 2000)")
    parser.add_argument("--queries", type=int, default=100, help="timed requests of each kind (default 100)")
    parser.add_argument("--warmup", type=int, default=10)
    parser.add_argument("--json", action="store_true", help="print the raw results as JSON")
    return parser.parse_args(argv)


async def update_round(nc: Any, prefix: str, bench: Bench, round_no: int) -> float:
    """Update every object of the scope once (64 in flight), against its current version; updates/s."""
    rows = bench.query("SELECT object_id, version_id FROM current_objects WHERE scope_id = %s ORDER BY object_id",
                       (SCOPE,))
    texts = corpus(len(rows), most_clauses=3, seed=100 + round_no)
    bodies = [msgspec.json.encode({"scope_id": SCOPE, "object_id": o, "expected_version_id": v, "actor": ACTOR,
                                   "provenance": PROVENANCE, "canonical_content": {"statement": t}})
              for (o, v), t in zip(rows, texts)]
    result = await drive_count(nc, command_subject(prefix, "update"), "updates", lambda i: (bodies[i], {
        "Pam-Idempotency-Key": f"bench:snapshot:update:{round_no}:{i}"}), check_result, 64, len(bodies), {})
    return result.rate


async def caught_up(bench: Bench) -> None:
    head = bench.head()
    await wait_until(lambda: int(bench.query(
        "SELECT coalesce(min(ledger_sequence), 0) FROM projection_checkpoints"
        " WHERE projection IN ('current_objects', 'indexer')")[0][0]) >= head, 1800, "followers at the head", 0.2)


async def timed_pairs(nc: Any, prefix: str, name: str, pairs: list[tuple[bytes, bytes]], warmup: int
                      ) -> tuple[list[float], list[float], list[Any], list[Any]]:
    """Each (live, snapshot) request in turn; wall-clock seconds of each and their results (after warm-up)."""
    subject = query_subject(prefix, name)
    live_t: list[float] = []
    snap_t: list[float] = []
    live_r: list[Any] = []
    snap_r: list[Any] = []
    for i, (live, snap) in enumerate(pairs):
        for body, times, results in ((live, live_t, live_r), (snap, snap_t, snap_r)):
            began = time.perf_counter()
            msg = await nc.request(subject, body, timeout=60)
            spent = time.perf_counter() - began
            decoded = json.loads(msg.data)
            if "result" not in decoded:
                raise RuntimeError(f"{name} failed: {msg.data[:300]!r}")
            if i >= warmup:
                times.append(spent)
                results.append(decoded["result"])
    return live_t, snap_t, live_r, snap_r


def summary(times: list[float]) -> dict[str, float]:
    ms = sorted(t * 1000 for t in times)
    return {"p50_ms": round(percentile(ms, 50), 2), "p95_ms": round(percentile(ms, 95), 2)}


def recall(found: list[Any], truth: list[list[str]]) -> float:
    hits = [len({i["object_id"] for i in f["items"]} & set(t)) / max(1, len(t)) for f, t in zip(found, truth)]
    return round(sum(hits) / max(1, len(hits)), 4)


def ground_truth(url: str, table: sql.Identifier, texts: list[str]) -> list[list[str]]:
    """The exact top-K of the scope in the live vector table (no index scan), as the service embeds the text."""
    embedder = embedder_for(descriptor_for(MODEL))
    assert embedder is not None
    vectors = embedder.embed([clean(t) for t in texts])
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("SET enable_indexscan = off")
        return [[r[0] for r in conn.execute(sql.SQL(
            "SELECT object_id FROM {} WHERE scope_id = %s ORDER BY embedding <=> %s::vector, object_id LIMIT %s"
        ).format(table), (SCOPE, vector_literal(v), K)).fetchall()] for v in vectors]


async def storage(url: str) -> dict[str, Any]:
    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
        space = await find_space(conn, None)
        assert space is not None
        out: dict[str, Any] = {}
        for label, table in (("live", space.table), ("kept", space.kept_table)):
            rows = await (await conn.execute(sql.SQL("SELECT count(*) FROM {}").format(table))).fetchone()
            size = await (await conn.execute("SELECT pg_total_relation_size(%s::regclass)",
                                             (table.as_string(conn),))).fetchone()
            out[label] = {"rows": int(rows[0]) if rows else 0, "bytes": int(size[0]) if size else 0}
        out["kept_bytes_per_row"] = round(out["kept"]["bytes"] / max(1, out["kept"]["rows"]), 1)
        return out


async def run(args: argparse.Namespace) -> dict[str, Any]:
    out: dict[str, Any] = {"objects": args.objects, "versions_per_object": 3, "model": MODEL,
                           "queries": args.queries, "loadavg_start": os.getloadavg()}
    with bench_servers() as servers:
        bench = Bench(servers, MODEL, "snapshot")
        nc = await connect(servers.nats_url)
        try:
            await bench.started(nc, "snapshot-all", "writer,query,projector,gateway,indexer")
            await make_scopes(nc, bench.prefix, [SCOPE])
            log(f"creating {args.objects:,} claims, then updating each twice ...")
            bodies = [msgspec.json.encode({"scope_id": SCOPE, "object_type": "claim", "actor": ACTOR,
                                           "provenance": PROVENANCE, "canonical_content": {"statement": t}})
                      for t in corpus(args.objects, most_clauses=3, seed=51)]
            out["creates_per_s"] = round(await create_all(nc, bench.prefix, bodies, "snapshot"), 1)
            for round_no in (1, 2):
                await caught_up(bench)
                out[f"updates_{round_no}_per_s"] = round(await update_round(nc, bench.prefix, bench, round_no), 1)
            await caught_up(bench)
            msg = await nc.request(command_subject(bench.prefix, "snapshot_create"), msgspec.json.encode({
                "scope_id": SCOPE, "actor": ACTOR, "snapshot": {"snapshot_id": "snap:bench"}}), timeout=60)
            sealed = json.loads(msg.data)
            assert "result" in sealed, sealed
            await caught_up(bench)
            out["storage"] = await storage(bench.url)
            n = args.queries + args.warmup
            live_q = msgspec.json.encode({"scope_id": SCOPE, "limit": K, **UNVERIFIED})
            snap_q = msgspec.json.encode({"scope_id": SCOPE, "limit": K, "snapshot_id": "snap:bench", **UNVERIFIED})
            log(f"{n} queries live and at the snapshot ...")
            lt, st, _, _ = await timed_pairs(nc, bench.prefix, "query", [(live_q, snap_q)] * n, args.warmup)
            out["query"] = {"live": summary(lt), "snapshot": summary(st)}
            out["query"]["p50_ratio"] = round(out["query"]["snapshot"]["p50_ms"] / out["query"]["live"]["p50_ms"], 2)
            texts = corpus(n, most_clauses=2, seed=77)
            pairs = [(msgspec.json.encode({"scope_id": SCOPE, "text": t, "mode": "semantic", "limit": K, **UNVERIFIED}),
                      msgspec.json.encode({"scope_id": SCOPE, "text": t, "mode": "semantic", "limit": K,
                                           "snapshot_id": "snap:bench", **UNVERIFIED})) for t in texts]
            log(f"{n} semantic searches live and at the snapshot ...")
            lt, st, lr, sr = await timed_pairs(nc, bench.prefix, "search", pairs, args.warmup)
            async with await psycopg.AsyncConnection.connect(bench.url, autocommit=True) as conn:
                space = await find_space(conn, None)
            assert space is not None
            truth = ground_truth(bench.url, space.table, texts[args.warmup:])
            out["semantic"] = {"live": {**summary(lt), "recall_at_10": recall(lr, truth),
                                        "method": sorted({r["index"]["method"] for r in lr})},
                               "snapshot": {**summary(st), "recall_at_10": recall(sr, truth),
                                            "method": sorted({r["index"]["method"] for r in sr})}}
            out["semantic"]["p50_ratio"] = round(out["semantic"]["snapshot"]["p50_ms"]
                                                 / out["semantic"]["live"]["p50_ms"], 2)
        finally:
            bench.stop()
            await nc.close()
    out["loadavg_end"] = os.getloadavg()
    return out


def render(out: dict[str, Any]) -> str:
    q, s, st = out["query"], out["semantic"], out["storage"]
    return "\n".join([
        f"snapshot bench: {out['objects']:,} objects x {out['versions_per_object']} versions, {MODEL},"
        f" {out['queries']} timed requests each",
        f"  query     live p50 {q['live']['p50_ms']} ms  snapshot p50 {q['snapshot']['p50_ms']} ms"
        f"  ratio {q['p50_ratio']} (target <= 1.5)",
        f"  semantic  live p50 {s['live']['p50_ms']} ms ({'/'.join(s['live']['method'])}, recall@10"
        f" {s['live']['recall_at_10']})  snapshot p50 {s['snapshot']['p50_ms']} ms (recall@10"
        f" {s['snapshot']['recall_at_10']})  ratio {s['p50_ratio']} (target <= 1.5)",
        f"  storage   kept {st['kept']['rows']:,} rows, {st['kept']['bytes'] / 1e6:.1f} MB"
        f" ({st['kept_bytes_per_row']} B/row); live {st['live']['rows']:,} rows, {st['live']['bytes'] / 1e6:.1f} MB"
        " (with HNSW)",
    ])


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    out = asyncio.run(run(args))
    print(json.dumps(out, indent=2) if args.json else render(out))
    return 0
