"""`python -m bench search_service`: semantic search THROUGH THE SERVICE at 200,000 vectors (issue #13).

bench/search measured the search SQL alone. This measures `{prefix}.query.search` (query/semantic.py):
NATS, the join with `current_objects` inside the HNSW scan, the filters, content and envelopes, on the same
layout (one scope of N/2, 100 scopes of N/200) and the same clustered vectors (bench/search_data).

How: private servers, a fresh database, the service as a process with roles writer,query,projector,gateway
(no indexer). N claims are created THROUGH THE WRITER (64 in flight); the run waits until the projection
checkpoint reaches the head. MiniLM's space is registered through the writer and made the default
(`record_index_event` {index_rebuilt, default_space_set}).

THE INDEXER IS BYPASSED: without an indexer role nobody projects the registry row or fills the vector
table, so this bench does it itself: `create_space` (registered_sequence = the registration's ledger
sequence), the row set ready + default, the HNSW index dropped, one COPY of a vector per object
(version_sequence 1, content_digest from current_objects), the index rebuilt, VACUUM ANALYZE. The vectors
are search_data's (real MiniLM + noisy copies), not the indexer's embeddings of the claims' text
(each claim's text is its vector's cluster source, so close to what MiniLM would make of it, not equal).

Objects are created `unverified`, which the default search filters hide: every request passes
`validation_states: ["unverified"]`. Requests are serial, one at a time after a warm-up, each timed wall
clock at the client. Ground truth: exact top-10 within the scope from SQL (enable_indexscan off).
Baselines from the same run: a `status.query` NATS round trip (no work), and the bench SQL alone
(bench/search_sql: HNSW ef 400 / 40 candidates for the big scope, the exact CTE for small ones).
Targets: recall@10 >= 0.95 in both kinds of scope, p50 <= 20 ms.

Text modes (`--text-modes`, default semantic-text, lexical, hybrid): the same scopes searched by text, the
held-out sentence behind each query vector and a short phrase of it (`--query-texts`), with the space
MiniLM's (the service embeds the text) and each claim's statement the text of its vector's cluster
source, so the lexical and semantic lists look at the same neighbourhoods. Baselines for them: MiniLM on
one text in this process, the lexical list's SQL alone, and `query.query` full text (projection's query
path). `--mid` adds mid-size scopes (bench.search --mid), searched by vector.
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

from bench.indexing import Bench, create_all, wait_until
from bench.load import check_result
from bench.search import embed_corpus
from bench.search_data import BIG_SCOPE, DOMAINS, Layout, assemble, mid_scope, small_scope, texts
from bench.search_report import percentile
from bench.search_service_load import create_bodies, load_vectors, make_scopes, register_default
from bench.search_sql import (EXACT_SETTINGS, GROUND_TRUTH_SETTINGS, HnswSetting, exact_query, ground_truth_query,
                              hnsw_query, search, timed_searches)
from bench.servers import bench_servers
from bench.service import connect
from embedding.known import descriptor_for, embedder_for
from embedding.store import find_space, vector_literal
from embedding.text_profile import clean
from infra.settings import QuerySettings
from pamledger_client.protocol.subjects import query_subject, status_subject
from query.hybrid import lexical_request
from query.plan import build
from query.semantic import exact_statement, hnsw_statement, nearest  # bench only: the service's SQL alone, to split its latency
from schemas.search import decode_search

K = 10


def log(message: str) -> None:
    print(f"bench search_service [{time.strftime('%H:%M:%S')}]: {message}", file=sys.stderr, flush=True)


def stats(times: list[float], recalls: list[float] | None = None) -> dict[str, Any]:
    out: dict[str, Any] = {"n": len(times), "p50_ms": round(percentile(times, 50), 2),
                           "p95_ms": round(percentile(times, 95), 2)}
    if recalls is not None:
        out.update(recall=round(float(np.mean(recalls)), 4), min_recall=round(float(np.min(recalls)), 2))
    return out


async def timed_requests(nc: Any, subject: str, bodies: list[bytes], warmup: int,
                         truth: list[list[str]] | None = None) -> tuple[dict[str, Any], set[str]]:
    """Send each body alone (after `warmup` untimed ones), wall clock at the client: latency stats, the median
    items per reply, recall@10 against `truth` when given, and the `index.method`s the replies named."""
    async def one(body: bytes) -> dict[str, Any]:
        msg = await nc.request(subject, body, timeout=30)
        check_result(msg.data, body)
        return msgspec.json.decode(msg.data)["result"]  # type: ignore[no-any-return]

    for body in bodies[:warmup]:
        await one(body)
    times, recalls, hits, methods = [], [], [], set()
    for i, body in enumerate(bodies):
        t0 = time.perf_counter()
        result = await one(body)
        times.append((time.perf_counter() - t0) * 1000)
        methods.add(str((result.get("index") or {}).get("method")))
        got = [item.get("object_id") or item.get("envelope", {}).get("object_id") for item in result["items"]]
        hits.append(len(got))
        if truth is not None:
            recalls.append(len(set(got) & set(truth[i])) / len(truth[i]))
    out = stats(times, recalls if truth is not None else None)
    out["items_p50"] = float(np.median(hits))
    return out, methods


def search_bodies(space_id: str, mode: str, scopes: list[str], probes: list[Any]) -> list[bytes]:
    """`query.search` requests: `probes` are vectors (lists of floats) or texts."""
    bodies = []
    for scope, probe in zip(scopes, probes):
        body: dict[str, Any] = {"scope_id": scope, "mode": mode, "limit": K, "validation_states": ["unverified"]}
        body.update({"text": probe} if isinstance(probe, str) else {"vector": probe})
        if mode != "lexical":
            body["embedding_space_id"] = space_id
        bodies.append(msgspec.json.encode(body))
    return bodies


async def through_service(nc: Any, prefix: str, space_id: str, jobs: list[tuple[str, list[float]]],
                          truth: list[list[str]], warmup: int) -> tuple[dict[str, Any], set[str]]:
    """Semantic search by vector through the service, recall@10 against the exact top-10."""
    bodies = search_bodies(space_id, "semantic", [s for s, _ in jobs], [v for _, v in jobs])
    return await timed_requests(nc, query_subject(prefix, "search"), bodies, warmup, truth)


async def lexical_sql(url: str, scopes: list[str], query_texts: list[str], warmup: int) -> dict[str, Any]:
    """The lexical list's SQL alone (query.plan for the search's QueryRequest, as query.hybrid builds it), on one
    warm connection in a read-only REPEATABLE READ transaction: lexical mode minus NATS, decoding, envelopes."""
    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
        async def one(scope: str, text: str) -> int:
            request = decode_search(msgspec.json.encode({
                "scope_id": scope, "text": text, "mode": "lexical", "limit": K, "validation_states": ["unverified"]}))
            statement, params = build(lexical_request(request, K), None, None)
            await conn.execute("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY")
            try:
                cur = await conn.execute(statement, params)
                return len((await cur.fetchall())[:K])
            finally:
                await conn.execute("ROLLBACK")

        for scope, text in list(zip(scopes, query_texts))[:warmup]:
            await one(scope, text)
        times, hits = [], []
        for scope, text in zip(scopes, query_texts):
            t0 = time.perf_counter()
            hits.append(await one(scope, text))
            times.append((time.perf_counter() - t0) * 1000)
    out = stats(times)
    out["items_p50"] = float(np.median(hits))
    return out


def embed_baseline(query_texts: list[str], warmup: int) -> dict[str, Any]:
    """MiniLM on one query text at a time in this process (what the service's text modes pay to embed)."""
    embedder = embedder_for(descriptor_for("minilm"))
    assert embedder is not None
    for text in query_texts[:warmup]:
        embedder.embed([clean(text)])
    times = []
    for text in query_texts:
        t0 = time.perf_counter()
        embedder.embed([clean(text)])
        times.append((time.perf_counter() - t0) * 1000)
    return stats(times)


def phrase(text: str) -> str:
    """A short query from a text: the first object phrase of its vocabulary it contains ("the quarterly
    revenue report"), as a user would type it; a sentence's every word ANDed (websearch_to_tsquery) rarely
    matches anything, a phrase matches thousands of a 100,000 scope's rows."""
    found = [(text.find(o), o) for domain in DOMAINS for o in domain[2] if o in text]
    return min(found)[1] if found else text


def object_statements(vectors: np.ndarray, real: np.ndarray, corpus: list[str]) -> list[str]:
    """Each object's claim text: the text of the real vector nearest to its vector (its cluster's source),
    so the lexical and the semantic lists of one query look at the same neighbourhoods."""
    nearest_real = np.concatenate([np.argmax(vectors[i:i + 10_000] @ real.T, axis=1)
                                   for i in range(0, len(vectors), 10_000)])
    return [corpus[int(j)] for j in nearest_real]


def through_hnsw(kind: str) -> bool:
    """Whether the service searches this kind of scope through HNSW: the big one, and a mid-size one ("mid:N")
    above the exact threshold; the 1,000 scopes exactly."""
    return kind == "big" or (kind.startswith("mid:") and int(kind[4:]) > QuerySettings().search_exact_threshold)


def bench_sql(url: str, table: str, kind: str, jobs: list[tuple[str, str]], truth: list[list[str]],
              warmup: int) -> dict[str, Any]:
    """The same searches as the bench SQL alone (no join, no envelopes): what the service adds on top."""
    t = sql.Identifier(table)
    q = QuerySettings()
    hnsw = HnswSetting(q.search_ef_search, max(4 * K, 40), q.search_max_scan_tuples)
    statement, settings, extra = ((hnsw_query(t), hnsw.settings(), {"candidates": hnsw.candidates})
                                  if through_hnsw(kind) else (exact_query(t), EXACT_SETTINGS, {}))
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
            if through_hnsw(kind):
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
    layout = Layout.for_total(args.objects, mid=args.mid)
    log(f"embedding {args.real} real texts + {(args.queries + 1) // 2} held-out with MiniLM ...")
    real, queries, _ = embed_corpus(args.real, args.queries, args.seed)
    # The texts behind those vectors, as embed_corpus drew them: the table's, then the held-out queries'
    # (a noisy copy's text is its source's).
    corpus = texts(args.real, args.seed)
    held = texts((args.queries + 1) // 2, args.seed + 1, exclude=frozenset(corpus))
    query_texts = [held[i % len(held)] for i in range(len(queries))]
    rng = np.random.default_rng(args.seed)
    vectors, scopes = assemble(real, layout, rng)
    statements = object_statements(vectors, real, corpus)
    out: dict[str, Any] = {"objects": layout.total, "layout": vars(layout), "queries": len(queries),
                           "indexer": "BYPASSED (vectors COPYed by the bench)", "loadavg_start": os.getloadavg(),
                           "modes": sorted(args.modes)}
    with bench_servers() as servers:
        bench = Bench(servers, "hashing-384", "m4svc")
        nc = await connect(servers.nats_url)
        try:
            await bench.started(nc, "m4svc-core", "writer,query,projector,gateway")
            names = sorted(set(scopes))
            await make_scopes(nc, bench.prefix, names)
            log(f"creating {layout.total:,} claims through the writer (1 scope of {layout.big:,},"
                f" {layout.small_count} of {layout.small_size:,}) ...")
            out["creates_per_s"] = round(await create_all(nc, bench.prefix, create_bodies(scopes, statements), "svc"),
                                         1)
            head = bench.head()
            began = time.perf_counter()
            await wait_until(lambda: int((bench.query("SELECT coalesce(max(ledger_sequence), 0) FROM"
                                                      " projection_checkpoints WHERE projection = 'current_objects'")
                                          or [(0,)])[0][0]) >= head, 1800, "the projection reaching the head", 0.2)
            out["projection_wait_s"] = round(time.perf_counter() - began, 1)
            log(f"created at {out['creates_per_s']}/s; projection at the head; registering the space ...")
            space, registered = await register_default(nc, bench.prefix, "minilm")
            log("BYPASSING THE INDEXER: COPY of one vector per object, HNSW rebuilt ...")
            table, _, out["load"] = await load_vectors(bench.url, space, registered, vectors, scopes)
            literals = [vector_literal(q.tolist()) for q in queries]
            small_ids = rng.integers(0, layout.small_count, len(queries))
            kinds = {"big": [BIG_SCOPE] * len(queries), "small": [small_scope(int(i)) for i in small_ids],
                     **{f"mid:{m}": [mid_scope(m)] * len(queries) for m in layout.mid}}
            out["kinds"] = list(kinds)
            truth: dict[str, list[list[str]]] = {}
            with psycopg.connect(bench.url, autocommit=True) as conn:
                for kind, kscopes in kinds.items():
                    truth[kind] = [[r[0] for r in search(conn, ground_truth_query(sql.Identifier(table)),
                                                         GROUND_TRUTH_SETTINGS, {"scope": s, "q": q, "k": K})]
                                   for s, q in zip(kscopes, literals)]
            out["status_query_baseline"] = await status_round_trip(nc, bench.prefix)
            warm = min(20, len(queries))
            if {"lexical", "hybrid"} & set(args.modes) or "semantic-text" in args.modes:
                log("baseline: MiniLM on one query text at a time, in the bench process ...")
                out["embed_baseline"] = embed_baseline(query_texts, warm)
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
                search_subject = query_subject(bench.prefix, "search")
                for shape in args.query_texts if not kind.startswith("mid:") else ():  # mid-size: by vector only
                    shaped = query_texts if shape == "sentence" else [phrase(t) for t in query_texts]
                    found_by_mode: dict[str, Any] = {}
                    for mode in ("semantic-text", "lexical", "hybrid"):
                        if mode not in args.modes:
                            continue
                        log(f"{kind}: {len(queries)} {mode} searches by {shape} through the service ...")
                        bodies = search_bodies(space.embedding_space_id, mode.removesuffix("-text"), kscopes, shaped)
                        found, methods = await timed_requests(nc, search_subject, bodies, warm)
                        found["index_method"] = sorted(methods)
                        found_by_mode[mode] = found
                    if "lexical" in args.modes:
                        found_by_mode["lexical_sql"] = await lexical_sql(bench.url, kscopes, shaped, warm)
                        log(f"{kind}: {len(queries)} full-text queries by {shape} (query.query, order score) ...")
                        bodies = [msgspec.json.encode({"scope_id": sc, "text": t, "order": "score", "limit": K,
                                                       "validation_states": ["unverified"]})
                                  for sc, t in zip(kscopes, shaped)]
                        found_by_mode["query_fulltext"], _ = await timed_requests(
                            nc, query_subject(bench.prefix, "query"), bodies, warm)
                    out[kind][shape] = found_by_mode
        finally:
            bench.stop()
            await nc.close()
    out["loadavg_end"] = os.getloadavg()
    return out


def _line(kind: str, label: str, s: dict[str, Any]) -> str:
    recall = f"{s['recall']:>9.4f} {s['min_recall']:>5.2f}" if "recall" in s else f"{'-':>9} {'-':>5}"
    items = f"{s['items_p50']:>6g}" if "items_p50" in s else f"{'-':>6}"
    return f"{kind:<6} {label:<46} {recall} {items} {s['p50_ms']:>8.2f} {s['p95_ms']:>8.2f}"


def render(out: dict[str, Any]) -> str:
    lines = [f"bench search_service: {out['objects']:,} objects through the writer ({out['creates_per_s']}/s),"
             f" vectors: {out['indexer']}; {out['queries']} queries per kind; loadavg {out['loadavg_start'][0]:.1f}"
             f" -> {out['loadavg_end'][0]:.1f}",
             f"baseline status.query NATS round trip: p50 {out['status_query_baseline']['p50_ms']} ms,"
             f" p95 {out['status_query_baseline']['p95_ms']} ms"]
    if "embed_baseline" in out:
        e = out["embed_baseline"]
        lines.append(f"baseline MiniLM, one query text in the bench process: p50 {e['p50_ms']} ms,"
                     f" p95 {e['p95_ms']} ms")
    lines.append(f"{'scope':<6} {'path':<46} {'recall@10':>9} {'min':>5} {'items':>6} {'p50 ms':>8} {'p95 ms':>8}")
    kinds = out.get("kinds", ["big", "small"])
    for kind in kinds:
        k = out[kind]
        s = k["service"]
        label = f"semantic, vector (index.method {','.join(s['index_method'])})"
        lines.append(_line(kind.replace("mid:", "")[:6], label, s))
        lines.append(_line("", "  service SQL alone (semantic.nearest)", k["service_sql"]))
        lines.append(_line("", "  bench SQL alone (" + ("hnsw ef400/c40)" if through_hnsw(kind) else "exact CTE)"),
                           k["bench_sql"]))
        for shape in ("sentence", "phrase"):
            t = k.get(shape, {})
            if "semantic-text" in t:
                lines.append(_line("", f"semantic, {shape} (embedded by the service)", t["semantic-text"]))
            if "lexical" in t:
                lines.append(_line("", f"lexical, {shape}", t["lexical"]))
                lines.append(_line("", "  lexical SQL alone (query.plan)", t["lexical_sql"]))
                lines.append(_line("", "  query.query full text, order score", t["query_fulltext"]))
            if "hybrid" in t:
                lines.append(_line("", f"hybrid, {shape} (RRF of 50 + 50)", t["hybrid"]))
    for kind in kinds:
        s = out[kind]["service"]
        ok = s["recall"] >= 0.95 and s["p50_ms"] <= 20
        lines.append(f"{'PASS' if ok else 'MISS'} {kind}: recall@10 {s['recall']:.4f} (>= 0.95),"
                     f" p50 {s['p50_ms']:.2f} ms (<= 20)")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench search_service", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--objects", type=int, default=None, help="objects created (default 200000)")
    parser.add_argument("--queries", type=int, default=None, help="query vectors per kind (default 200)")
    parser.add_argument("--real", type=int, default=None, help="real MiniLM vectors among them (default 2500)")
    parser.add_argument("--quick", action="store_true", help="20,000 objects, 500 real, 40 queries")
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--explain", action="store_true", help="print EXPLAIN ANALYZE of one service statement per kind")
    parser.add_argument("--text-modes", default="semantic-text,lexical,hybrid",
                        help="searches by text timed besides semantic by vector: semantic-text, lexical, hybrid"
                             " (comma list, 'none' for none; default all three)")
    parser.add_argument("--query-texts", default="sentence,phrase",
                        help="texts of the text modes: 'sentence' (the held-out text behind each query vector) and/or"
                             " 'phrase' (its first vocabulary phrase, e.g. 'the quarterly revenue report')")
    parser.add_argument("--mid", default="", metavar="N,N,...",
                        help="also one scope of each of these sizes, carved out of the big one (bench.search"
                             " --mid), searched by vector only")
    parser.add_argument("--json", default=None, help="also write the results here")
    args = parser.parse_args(argv)
    args.mid = tuple(int(x) for x in args.mid.split(",") if x.strip())
    args.modes = {m.strip() for m in args.text_modes.split(",") if m.strip() and m.strip() != "none"}
    args.query_texts = [t.strip() for t in args.query_texts.split(",") if t.strip()]
    if set(args.query_texts) - {"sentence", "phrase"}:
        parser.error("--query-texts takes sentence and/or phrase")
    if args.modes - {"semantic-text", "lexical", "hybrid"}:
        parser.error("--text-modes takes semantic-text, lexical, hybrid or none")
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
