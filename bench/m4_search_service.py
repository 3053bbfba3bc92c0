"""`python -m bench.m4_search_service`: semantic search THROUGH THE SERVICE at 200,000 vectors (issue #13).

bench/m4_search measured the search SQL alone. This measures `{prefix}.query.search` (query/semantic.py):
NATS, the join with `current_objects` inside the HNSW scan, the filters, content and envelopes, on the same
layout (one scope of N/2, 100 scopes of N/200) and the same clustered vectors (bench/m4_search_data).

How: private servers, a fresh database, the service as a process with roles writer,query,projector,gateway
(no indexer). N claims are created THROUGH THE WRITER (64 in flight); the run waits until the projection
checkpoint reaches the head. A hashing-384 space is registered through the writer and made the default
(`record_index_event` {index_rebuilt, default_space_set}).

THE INDEXER IS BYPASSED: without an indexer role nobody projects the registry row or fills the vector
table, so this bench does it itself: `create_space` (registered_sequence = the registration's ledger
sequence), the row set ready + default, the HNSW index dropped, one COPY of a vector per object
(version_sequence 1, content_digest from current_objects), the index rebuilt, VACUUM ANALYZE. The vectors
are m4_search_data's (real MiniLM + noisy copies), not the hashing embeddings of the claims' text: the
space's descriptor only has to say 384 dimensions; no text query is sent.

Objects are created `unverified`, which the default search filters hide: every request passes
`validation_states: ["unverified"]`. Requests are serial, one at a time after a warm-up, each timed wall
clock at the client. Ground truth: exact top-10 within the scope from SQL (enable_indexscan off).
Baselines from the same run: a `status.query` NATS round trip (no work), and the bench SQL alone
(bench/m4_search_sql: HNSW ef 400 / 40 candidates for the big scope, the exact CTE for small ones).
Targets: recall@10 >= 0.95 in both kinds of scope, p50 <= 20 ms.
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
import numpy as np
import psycopg
from psycopg import sql

from bench.load import check_result
from bench.m4_index import Bench, create_all, wait_until
from bench.m4_search import embed_corpus
from bench.m4_search_data import BIG_SCOPE, Layout, assemble, small_scope
from bench.m4_search_report import percentile
from bench.m4_search_service_load import create_bodies, load_vectors, make_scopes, register_default
from bench.m4_search_sql import (EXACT_SETTINGS, GROUND_TRUTH_SETTINGS, HnswSetting, exact_query, ground_truth_query,
                                 hnsw_query, search, timed_searches)
from bench.servers import bench_servers
from bench.service import connect
from infra.embedding.store import find_space, vector_literal
from infra.settings import QuerySettings
from infra.subjects import query_subject, status_subject
from query.semantic import exact_statement, hnsw_statement, nearest  # bench only: the service's SQL alone, to split its latency
from schemas.search import decode_search

K = 10


def log(message: str) -> None:
    print(f"m4_search_service [{time.strftime('%H:%M:%S')}]: {message}", file=sys.stderr, flush=True)


def stats(times: list[float], recalls: list[float] | None = None) -> dict[str, Any]:
    out: dict[str, Any] = {"n": len(times), "p50_ms": round(percentile(times, 50), 2),
                           "p95_ms": round(percentile(times, 95), 2)}
    if recalls is not None:
        out.update(recall=round(float(np.mean(recalls)), 4), min_recall=round(float(np.min(recalls)), 2))
    return out


async def through_service(nc: Any, prefix: str, space_id: str, jobs: list[tuple[str, list[float]]],
                          truth: list[list[str]], warmup: int) -> tuple[dict[str, Any], set[str]]:
    subject = query_subject(prefix, "search")

    async def one(scope: str, vector: list[float]) -> dict[str, Any]:
        body = msgspec.json.encode({"scope_id": scope, "vector": vector, "embedding_space_id": space_id,
                                    "mode": "semantic", "limit": K, "validation_states": ["unverified"]})
        msg = await nc.request(subject, body, timeout=30)
        check_result(msg.data, body)
        return msgspec.json.decode(msg.data)["result"]  # type: ignore[no-any-return]

    for scope, vector in jobs[:warmup]:
        await one(scope, vector)
    times, recalls, methods = [], [], set()
    for (scope, vector), expected in zip(jobs, truth):
        t0 = time.perf_counter()
        result = await one(scope, vector)
        times.append((time.perf_counter() - t0) * 1000)
        methods.add(str((result.get("index") or {}).get("method")))
        got = {item["object_id"] for item in result["items"]}
        recalls.append(len(got & set(expected)) / len(expected))
    return stats(times, recalls), methods


def bench_sql(url: str, table: str, kind: str, jobs: list[tuple[str, str]], truth: list[list[str]],
              warmup: int) -> dict[str, Any]:
    """The same searches as the bench SQL alone (no join, no envelopes): what the service adds on top."""
    t = sql.Identifier(table)
    hnsw = HnswSetting(400, 40)
    statement, settings, extra = ((hnsw_query(t), hnsw.settings(), {"candidates": 40}) if kind == "big"
                                  else (exact_query(t), EXACT_SETTINGS, {}))
    with psycopg.connect(url, autocommit=True) as conn:
        times, recalls = timed_searches(conn, statement, settings, jobs, truth, K, extra, warmup)
    return stats(times, recalls)


async def service_sql(url: str, space_id: str, jobs: list[tuple[str, list[float]]], truth: list[list[str]],
                      warmup: int) -> dict[str, Any]:
    """The service's own SQL (query.semantic.nearest: the current_objects join, filters, content), called in
    this process on one warm connection: the service's latency minus NATS, decoding and envelopes."""
    settings = QuerySettings()
    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
        space = await find_space(conn, space_id)
        assert space is not None

        async def one(scope: str, vector: list[float]) -> list[Any]:
            request = decode_search(msgspec.json.encode({
                "scope_id": scope, "vector": vector, "embedding_space_id": space_id, "mode": "semantic",
                "limit": K, "validation_states": ["unverified"]}))
            await conn.execute("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY")
            try:
                rows, _ = await nearest(conn, space, vector, request, K, settings)
            finally:
                await conn.execute("ROLLBACK")
            return rows

        for scope, vector in jobs[:warmup]:
            await one(scope, vector)
        times, recalls = [], []
        for (scope, vector), expected in zip(jobs, truth):
            t0 = time.perf_counter()
            rows = await one(scope, vector)
            times.append((time.perf_counter() - t0) * 1000)
            recalls.append(len({r[2] for r in rows} & set(expected)) / len(expected))
    return stats(times, recalls)


async def explain(url: str, space_id: str, kind: str, scope: str, vector: list[float]) -> list[str]:
    """EXPLAIN (ANALYZE, BUFFERS) of the service's statement for one request, under the service's settings."""
    settings = QuerySettings()
    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
        space = await find_space(conn, space_id)
        assert space is not None
        request = decode_search(msgspec.json.encode({
            "scope_id": scope, "vector": vector, "embedding_space_id": space_id, "mode": "semantic", "limit": K,
            "validation_states": ["unverified"]}))
        literal = vector_literal(vector)
        async with conn.transaction():
            if kind == "big":
                for name, value in (("hnsw.ef_search", settings.search_ef_search),
                                    ("hnsw.iterative_scan", "relaxed_order"),
                                    ("hnsw.max_scan_tuples", settings.search_max_scan_tuples), ("enable_sort", "off")):
                    await conn.execute("SELECT set_config(%s, %s, true)", (name, str(value)))
                statement, params = hnsw_statement(space, literal, request, K, max(4 * K, 40))
            else:
                statement, params = exact_statement(space, literal, request, K, max(4 * K, 100))
            cur = await conn.execute(sql.SQL("EXPLAIN (ANALYZE, BUFFERS) ") + statement, params)
            return [str(r[0]) for r in await cur.fetchall()]


async def status_round_trip(nc: Any, prefix: str, n: int = 300) -> dict[str, Any]:
    subject = status_subject(prefix, "query")
    await nc.request(subject, b"", timeout=10)
    times = []
    for _ in range(n):
        t0 = time.perf_counter()
        await nc.request(subject, b"", timeout=10)
        times.append((time.perf_counter() - t0) * 1000)
    return stats(times)


async def run(args: argparse.Namespace) -> dict[str, Any]:
    layout = Layout.for_total(args.objects)
    log(f"embedding {args.real} real texts + {(args.queries + 1) // 2} held-out with MiniLM ...")
    real, queries, _ = embed_corpus(args.real, args.queries, args.seed)
    rng = np.random.default_rng(args.seed)
    vectors, scopes = assemble(real, layout, rng)
    out: dict[str, Any] = {"objects": layout.total, "layout": vars(layout), "queries": len(queries),
                           "indexer": "BYPASSED (vectors COPYed by the bench)", "loadavg_start": os.getloadavg()}
    with bench_servers() as servers:
        bench = Bench(servers, "hashing-384", "m4svc")
        nc = await connect(servers.nats_url)
        try:
            await bench.started(nc, "m4svc-core", "writer,query,projector,gateway")
            names = sorted(set(scopes))
            await make_scopes(nc, bench.prefix, names)
            log(f"creating {layout.total:,} claims through the writer (1 scope of {layout.big:,},"
                f" {layout.small_count} of {layout.small_size:,}) ...")
            out["creates_per_s"] = round(await create_all(nc, bench.prefix, create_bodies(scopes), "svc"), 1)
            head = bench.head()
            began = time.perf_counter()
            await wait_until(lambda: int((bench.query("SELECT coalesce(max(ledger_sequence), 0) FROM"
                                                      " projection_checkpoints WHERE projection = 'current_objects'")
                                          or [(0,)])[0][0]) >= head, 1800, "the projection reaching the head", 0.2)
            out["projection_wait_s"] = round(time.perf_counter() - began, 1)
            log(f"created at {out['creates_per_s']}/s; projection at the head; registering the space ...")
            space, registered = await register_default(nc, bench.prefix)
            log("BYPASSING THE INDEXER: COPY of one vector per object, HNSW rebuilt ...")
            table, _, out["load"] = await load_vectors(bench.url, space, registered, vectors, scopes)
            literals = [vector_literal(q.tolist()) for q in queries]
            small_ids = rng.integers(0, layout.small_count, len(queries))
            kinds = {"big": [BIG_SCOPE] * len(queries), "small": [small_scope(int(i)) for i in small_ids]}
            truth: dict[str, list[list[str]]] = {}
            with psycopg.connect(bench.url, autocommit=True) as conn:
                for kind, kscopes in kinds.items():
                    truth[kind] = [[r[0] for r in search(conn, ground_truth_query(sql.Identifier(table)),
                                                         GROUND_TRUTH_SETTINGS, {"scope": s, "q": q, "k": K})]
                                   for s, q in zip(kscopes, literals)]
            out["status_query_baseline"] = await status_round_trip(nc, bench.prefix)
            warm = min(20, len(queries))
            for kind, kscopes in kinds.items():
                log(f"{kind}: {len(queries)} searches through the service ...")
                service, methods = await through_service(
                    nc, bench.prefix, space.embedding_space_id,
                    [(s, q.tolist()) for s, q in zip(kscopes, queries)], truth[kind], warm)
                service["index_method"] = sorted(methods)
                direct = await service_sql(bench.url, space.embedding_space_id,
                                           [(s, q.tolist()) for s, q in zip(kscopes, queries)], truth[kind], warm)
                sql_alone = bench_sql(bench.url, table, kind, list(zip(kscopes, literals)), truth[kind], warm)
                out[kind] = {"service": service, "service_sql": direct, "bench_sql": sql_alone,
                             "explain": await explain(bench.url, space.embedding_space_id, kind, kscopes[0],
                                                      queries[0].tolist())}
        finally:
            bench.stop()
            await nc.close()
    out["loadavg_end"] = os.getloadavg()
    return out


def render(out: dict[str, Any]) -> str:
    lines = [f"m4_search_service: {out['objects']:,} objects through the writer ({out['creates_per_s']}/s),"
             f" vectors: {out['indexer']}; {out['queries']} queries per kind; loadavg {out['loadavg_start'][0]:.1f}"
             f" -> {out['loadavg_end'][0]:.1f}",
             f"baseline status.query NATS round trip: p50 {out['status_query_baseline']['p50_ms']} ms,"
             f" p95 {out['status_query_baseline']['p95_ms']} ms",
             f"{'scope':<6} {'path':<37} {'recall@10':>9} {'min':>5} {'p50 ms':>8} {'p95 ms':>8}"]
    for kind in ("big", "small"):
        s, b = out[kind]["service"], out[kind]["bench_sql"]
        label = f"service (index.method {','.join(s['index_method'])})"
        lines.append(f"{kind:<6} {label:<37} {s['recall']:>9.4f} {s['min_recall']:>5.2f} {s['p50_ms']:>8.2f}"
                     f" {s['p95_ms']:>8.2f}")
        d = out[kind]["service_sql"]
        lines.append(f"{'':<6} {'service SQL alone (semantic.nearest)':<37} {d['recall']:>9.4f} {d['min_recall']:>5.2f}"
                     f" {d['p50_ms']:>8.2f} {d['p95_ms']:>8.2f}")
        sql_label = "bench SQL alone (" + ("hnsw ef400/c40)" if kind == "big" else "exact CTE)")
        lines.append(f"{'':<6} {sql_label:<37} {b['recall']:>9.4f} {b['min_recall']:>5.2f} {b['p50_ms']:>8.2f}"
                     f" {b['p95_ms']:>8.2f}")
    for kind in ("big", "small"):
        s = out[kind]["service"]
        ok = s["recall"] >= 0.95 and s["p50_ms"] <= 20
        lines.append(f"{'PASS' if ok else 'MISS'} {kind}: recall@10 {s['recall']:.4f} (>= 0.95),"
                     f" p50 {s['p50_ms']:.2f} ms (<= 20)")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.m4_search_service", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--objects", type=int, default=None, help="objects created (default 200000)")
    parser.add_argument("--queries", type=int, default=None, help="query vectors per kind (default 200)")
    parser.add_argument("--real", type=int, default=None, help="real MiniLM vectors among them (default 2500)")
    parser.add_argument("--quick", action="store_true", help="20,000 objects, 500 real, 40 queries")
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--explain", action="store_true", help="print EXPLAIN ANALYZE of one service statement per kind")
    parser.add_argument("--json", default=None, help="also write the results here")
    args = parser.parse_args(argv)
    args.objects = args.objects or (20_000 if args.quick else 200_000)
    args.real = args.real or (500 if args.quick else 2_500)
    args.queries = args.queries or (40 if args.quick else 200)
    out = asyncio.run(run(args))
    print(render(out))
    if args.explain:
        for kind in ("big", "small"):
            print(f"\nEXPLAIN ANALYZE, {kind} scope, the service's statement:\n" + "\n".join(
                line if len(line) <= 200 else line[:200] + " ..." for line in out[kind]["explain"]))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=2, default=str)
    return 0


if __name__ == "__main__":
    sys.exit(main())
