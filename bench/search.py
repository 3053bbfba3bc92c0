"""`python -m bench search`: scoped vector search, exact vs HNSW with iterative scans (issue #13, Search).

200,000 vectors of 384 dims in ONE space table (`embedding.store.create_space`) on a private
Postgres: one scope of 100,000 and 100 scopes of 1,000. A share are real MiniLM vectors of generated
texts, the rest clustered around them (bench/search_data.py). ~200 queries (held-out texts and noisy
copies) run against the big scope and against random small scopes; ground truth is the exact top-10 in
the scope (no index scan). Each method (bench/search_sql.py) reports recall@10 against it and wall
clock latency p50/p95 per query on one warm connection, next to the same run's baselines: a `SELECT 1`
round trip and the exact search of a 1,000-vector scope. Targets: recall@10 >= 0.95 in both kinds of
scope with p50 <= 20 ms. `--mid 5000,10000,30000` adds one scope of each size (carved out of the big
one), measured exact, at every HNSW setting and at the service's own (query/semantic.py's path above
its exact threshold): where between the two kinds the service's setting stops finding true neighbours.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import psycopg

from bench.search_data import (BIG_SCOPE, Layout, assemble, mid_scope, nearest_neighbour_cosine, noisy_copies,
                               small_scope, texts)
from bench.search_load import Loaded, load
from bench.search_report import Row, percentile, render
from bench.search_sql import (EXACT_SETTINGS, GROUND_TRUTH_SETTINGS, HnswSetting, exact_query,
                              ground_truth_query, hnsw_query, plan_uses, search, timed_searches)
from bench.servers import bench_servers
from embedding.embedders import MiniLMEmbedder
from embedding.store import vector_literal
from embedding.text_profile import prepare
from infra.settings import QuerySettings

K = 10


def log(message: str) -> None:
    print(f"bench search: {message}", file=sys.stderr, flush=True)


def parse_settings(text: str) -> list[HnswSetting]:
    """"40,100" or "40:40:20000,100:100": ef_search[:candidates[:max_scan_tuples]] (candidates = ef)."""
    found = []
    for item in (x.strip() for x in text.split(",") if x.strip()):
        parts = [int(p) for p in item.split(":")]
        ef = parts[0]
        found.append(HnswSetting(ef, parts[1] if len(parts) > 1 else ef,
                                 parts[2] if len(parts) > 2 else 20_000))
    return found


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench search", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--vectors", type=int, default=None, help="vectors in the table (default 200000)")
    parser.add_argument("--real", type=int, default=None, help="real MiniLM vectors among them (default 2500)")
    parser.add_argument("--queries", type=int, default=None, help="query vectors (default 200)")
    parser.add_argument("--quick", action="store_true", help="smoke run: 20,000 vectors, 500 real, 40 queries")
    parser.add_argument("--hnsw", default="40,100,200,400", help="HNSW settings ef[:candidates[:max_scan_tuples]]"
                                                                 " (default 40,100,200,400; candidates = ef)")
    parser.add_argument("--exact-big-queries", type=int, default=20,
                        help="queries timed for exact search of the big scope (slow by design; default 20)")
    parser.add_argument("--mid", default="", metavar="N,N,...",
                        help="also one scope of each of these sizes (e.g. 5000,10000,30000), carved out of the big"
                             " scope; each gets the exact path, every --hnsw setting and the service's own")
    parser.add_argument("--exact-mid-queries", type=int, default=50,
                        help="queries timed for exact search of each mid-size scope (default 50)")
    parser.add_argument("--mid-only", action="store_true",
                        help="with --mid: HNSW rows for the mid-size scopes only"
                             " (big and small scopes: exact, the baselines)")
    parser.add_argument("--maintenance-work-mem", default="1GB", help="for the HNSW build (default 1GB)")
    parser.add_argument("--build-workers", type=int, default=1,
                        help="max_parallel_maintenance_workers for the HNSW build (default 1: 2 cores)")
    parser.add_argument("--probe", type=int, default=20_000,
                        help="rows COPYed into the table with its index present, to compare (default 20000)")
    parser.add_argument("--graph", default=None, metavar="M:EF_CONSTRUCTION",
                        help="rebuild the HNSW index with these parameters instead of create_space's (16:64)")
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--json", default=None, help="also write every number as JSON to this path")
    args = parser.parse_args(argv)
    args.vectors = args.vectors or (20_000 if args.quick else 200_000)
    args.real = args.real or (500 if args.quick else 2_500)
    args.queries = args.queries or (40 if args.quick else 200)
    args.settings = parse_settings(args.hnsw)
    args.mid = tuple(int(x) for x in args.mid.split(",") if x.strip())
    args.graph = tuple(int(x) for x in args.graph.split(":")) if args.graph else None
    if args.graph is not None and len(args.graph) != 2:
        parser.error("--graph takes M:EF_CONSTRUCTION, e.g. 16:128")
    if args.real > args.vectors or args.vectors < 200 or args.queries < 2 or not args.settings:
        parser.error("need --vectors >= 200, --real <= --vectors, --queries >= 2 and one HNSW setting")
    return args


def embed_corpus(real_n: int, query_n: int, seed: int) -> tuple[np.ndarray, np.ndarray, dict[str, float]]:
    """MiniLM vectors of real_n texts (the table) and of held-out texts, half of the queries taken as they
    are and half as noisy copies; texts go through the claim profile as the indexer's would."""
    corpus = texts(real_n, seed)
    held = texts((query_n + 1) // 2, seed + 1, exclude=frozenset(corpus))
    embedder = MiniLMEmbedder(batch_size=32)
    embedder.embed(["warm up"])
    began = time.perf_counter()
    vectors = embedder.embed([prepare("claim", {"statement": t}).text for t in corpus + held])
    seconds = time.perf_counter() - began
    all_real = np.asarray(vectors, dtype=np.float32)
    real, held_vectors = all_real[:real_n], all_real[real_n:]
    noisy = noisy_copies(held_vectors, np.random.default_rng(seed))
    queries = np.concatenate([held_vectors, noisy])[:query_n]
    return real, queries, {"texts": len(vectors), "seconds": seconds, "per_second": len(vectors) / seconds}


def round_trip(conn: psycopg.Connection[Any], n: int = 1_000) -> list[float]:
    conn.execute("SELECT 1")
    times = []
    for _ in range(n):
        t0 = time.perf_counter()
        conn.execute("SELECT 1").fetchall()
        times.append((time.perf_counter() - t0) * 1000)
    return times


Method = tuple[str, str, str, Any, dict[str, str], dict[str, Any]]  # kind, name, setting, statement, settings, extra


def service_setting() -> HnswSetting:
    """What query/semantic.py runs above its exact threshold: the configured ef_search and max_scan_tuples,
    and max(4k, 40) candidates re-ranked (k = 10)."""
    q = QuerySettings()
    return HnswSetting(q.search_ef_search, max(4 * K, 40), q.search_max_scan_tuples)


def methods(loaded: Loaded, settings: list[HnswSetting], kinds: list[str], mid_only: bool = False) -> list[Method]:
    """Exact and every HNSW setting per scope kind; mid-size scopes also at the service's own setting.
    `mid_only`: the big and small scopes exact only (the baselines), HNSW for the mid-size ones."""
    table = loaded.table
    found: list[Method] = []
    for kind in kinds:
        found.append((kind, "exact", "CTE of the scope", exact_query(table), EXACT_SETTINGS, {}))
        mid = kind.startswith("mid:")
        if mid_only and not mid:
            continue
        extra = [service_setting()] if mid and service_setting() not in settings else []
        for s in settings + extra:
            found.append((kind, "hnsw+rerank", s.label, hnsw_query(table), s.settings(), {"candidates": s.candidates}))
    return found


def measure(conn: psycopg.Connection[Any], method: Method, jobs: list[tuple[str, str]],
            truth: list[list[str]], warmup: int, index_name: str) -> Row:
    """Warm up on a few queries, then time each query alone; recall@10 against the ground truth."""
    kind, name, setting, statement, settings, extra = method
    first = {"scope": jobs[0][0], "q": jobs[0][1], "k": K, **extra}
    uses_hnsw = plan_uses(conn, statement, settings, first, index_name)
    times, recalls = timed_searches(conn, statement, settings, jobs, truth, K, extra, warmup)
    return Row(kind, name, setting, uses_hnsw, len(times), float(np.mean(recalls)), float(np.min(recalls)),
               percentile(times, 50), percentile(times, 95))


def numpy_agreement(vectors: np.ndarray, scopes: list[str], queries: np.ndarray, jobs: list[tuple[str, str]],
                    truth: list[list[str]]) -> float:
    """Share of the SQL ground truth that numpy's exact top-10 (float32 dot products) agrees with."""
    scope_rows: dict[str, list[int]] = {}
    for i, s in enumerate(scopes):
        scope_rows.setdefault(s, []).append(i)
    overlaps = []
    for qi, ((scope, _), expected) in enumerate(zip(jobs, truth)):
        rows = np.asarray(scope_rows[scope])
        sims = vectors[rows] @ queries[qi % len(queries)]
        top = rows[np.argsort(-sims)[:K]]
        overlaps.append(len({f"obj-{i:07d}" for i in top} & set(expected)) / K)
    return float(np.mean(overlaps))


def run(url: str, args: argparse.Namespace) -> dict[str, Any]:
    layout = Layout.for_total(args.vectors, mid=args.mid)
    log(f"embedding {args.real} real texts and {(args.queries + 1) // 2} held-out ones with MiniLM ...")
    real, queries, embedding = embed_corpus(args.real, args.queries, args.seed)
    log(f"embedded {embedding['texts']} texts at {embedding['per_second']:.0f}/s")
    rng = np.random.default_rng(args.seed)
    vectors, scopes = assemble(real, layout, rng)
    stats_rng = np.random.default_rng(args.seed + 2)
    neighbours = {"real": nearest_neighbour_cosine(real, real, stats_rng),
                  "table": nearest_neighbour_cosine(vectors, vectors, stats_rng)}
    mids = "".join(f", 1 of {m:,}" for m in layout.mid)
    log(f"loading {layout.total:,} vectors (1 scope of {layout.big:,}{mids}, {layout.small_count} of"
        f" {layout.small_size:,}) ...")
    loaded = asyncio.run(load(url, vectors, scopes, args.probe, args.maintenance_work_mem, args.build_workers, log,
                              args.graph))
    literals = [vector_literal(q.tolist()) for q in queries]
    small_ids = rng.integers(0, layout.small_count, len(queries))
    jobs = {"big": [(BIG_SCOPE, q) for q in literals],
            "small": [(small_scope(int(i)), q) for i, q in zip(small_ids, literals)],
            **{f"mid:{m}": [(mid_scope(m), q) for q in literals] for m in layout.mid}}
    with psycopg.connect(url, autocommit=True) as conn:
        log("ground truth: exact top-10 per query and scope, index scans off ...")
        truth: dict[str, list[list[str]]] = {}
        gt_times: dict[str, list[float]] = {}
        for kind, kind_jobs in jobs.items():
            truth[kind], gt_times[kind] = [], []
            for scope, q in kind_jobs:
                t0 = time.perf_counter()
                found = search(conn, ground_truth_query(loaded.table), GROUND_TRUTH_SETTINGS,
                               {"scope": scope, "q": q, "k": K})
                gt_times[kind].append((time.perf_counter() - t0) * 1000)
                truth[kind].append([r[0] for r in found])
        agreement = {kind: numpy_agreement(vectors, scopes, queries, jobs[kind], truth[kind]) for kind in jobs}
        select1 = round_trip(conn)
        rows: list[Row] = []
        for method in methods(loaded, args.settings, list(jobs), args.mid_only):
            kind, name, setting = method[:3]
            n = len(queries)
            if name == "exact" and kind == "big":
                n = args.exact_big_queries
            elif name == "exact" and kind.startswith("mid:"):
                n = args.exact_mid_queries
            log(f"measuring {kind} / {name} / {setting} on {n} queries ...")
            rows.append(measure(conn, method, jobs[kind][:n], truth[kind][:n], min(20, n), loaded.index_name))
    return {"layout": {**vars(layout), "mid": list(layout.mid)}, "embedding": embedding,
            "load": vars(loaded.timings), "sizes": loaded.sizes,
            "select1_p50_ms": percentile(select1, 50), "select1_p95_ms": percentile(select1, 95),
            "ground_truth_p50_ms": {k: percentile(v, 50) for k, v in gt_times.items()},
            "numpy_agreement": agreement, "nn_cosine": neighbours, "rows": [vars(r) for r in rows],
            "queries": len(queries), "service_setting": service_setting().label,
            "settings": [vars(s) for s in args.settings]}


def main(argv: list[str] | None = None, runner: Callable[[str, argparse.Namespace], dict[str, Any]] = run) -> int:
    args = parse_args(argv)
    began, load_start = time.perf_counter(), os.getloadavg()[0]
    with bench_servers() as servers:
        name, url = servers.fresh_database("m4search")
        try:
            results = runner(url, args)
        finally:
            servers.drop_database(name)
    results.update(wall_seconds=time.perf_counter() - began, loadavg_start=load_start, loadavg_end=os.getloadavg()[0],
                   cores=os.cpu_count(), quick=args.quick)
    print(render(results))
    if args.json:
        with open(args.json, "w") as out:
            json.dump(results, out, indent=2, default=str)
    return 0
