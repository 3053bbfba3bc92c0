"""Projection's query step: structured and full-text Query latency through NATS and the real query service.

One request in flight (latency, not throughput), random scope per request, `limit` 50. Structured
variants mix the default filters, object_types, validation_states, committed_at windows and the
newest / oldest / committed_at_desc orders; every first page that has a `next_cursor` is followed by
its second page. Full text asks for one or two common words of the content vocabulary, ordered by
score or newest. Baselines from the same run: the NATS echo round trip (bench.echo, same payload size)
and "SQL only": the statement `query.plan.build` makes for a sample of the same requests, executed
directly on one connection. The slowest sample of every variant gets EXPLAIN (ANALYZE, BUFFERS).
"""

from __future__ import annotations

import base64
import random
import re
import statistics
import time
from collections.abc import Callable
from datetime import datetime, timezone
from typing import Any

import msgspec
import psycopg
from nats.aio.client import Client as NATS

from bench.ledger_content import search_text
from bench.load import REQUEST_TIMEOUT, BadReply, Result
from pamledger_client.protocol.subjects import query_subject
from query.plan import build
from schemas.queries import decode_query

Sample = tuple[float, str, bytes]  # (seconds, variant, request payload)
_decode = msgspec.json.Decoder(dict[str, Any]).decode


def structured_maker(scopes: list[str], t_start: float, t_end: float, rng: random.Random
                     ) -> Callable[[], tuple[str, dict[str, Any]]]:
    """A random structured query: (variant, request)."""
    def window() -> dict[str, Any]:
        span = t_end - t_start
        start = t_start + rng.random() * (span - 7 * 86_400)
        iso = [datetime.fromtimestamp(x, timezone.utc).isoformat().replace("+00:00", "Z")
               for x in (start, start + 7 * 86_400)]
        return {"committed_at": {"gte": iso[0], "lt": iso[1]}}

    variants: list[tuple[str, Callable[[], dict[str, Any]]]] = [
        ("defaults newest", lambda: {}),
        ("types newest", lambda: {"object_types": rng.choice((["claim"], ["claim", "decision"], ["task"]))}),
        ("validation oldest", lambda: {"validation_states": ["corroborated", "unverified"], "order": "oldest"}),
        ("7-day window newest", lambda: {"time": window()}),
        ("7-day window committed_at_desc", lambda: {"time": window(), "order": "committed_at_desc"}),
        ("committed_at_desc", lambda: {"order": "committed_at_desc", "object_types": ["claim", "observation"]}),
    ]

    def make() -> tuple[str, dict[str, Any]]:
        name, extra = rng.choice(variants)
        return name, {"scope_id": rng.choice(scopes), "limit": 50, **extra()}
    return make


def fulltext_maker(scopes: list[str], rng: random.Random) -> Callable[[], tuple[str, dict[str, Any]]]:
    def make() -> tuple[str, dict[str, Any]]:
        order = rng.choice(("score", "newest"))
        words = search_text(rng)
        return f"text order={order} ({len(words.split())} word{'s' if ' ' in words else ''})", {
            "scope_id": rng.choice(scopes), "text": words, "order": order, "limit": 50}
    return make


async def _ask(nc: NATS, subject: str, payload: bytes) -> tuple[float, dict[str, Any]]:
    t0 = time.perf_counter()
    msg = await nc.request(subject, payload, timeout=REQUEST_TIMEOUT)
    seconds = time.perf_counter() - t0
    if not msg.data.startswith(b'{"result":'):
        raise BadReply(f"query error: {msg.data[:600].decode(errors='replace')} for {payload[:300]!r}")
    return seconds, _decode(msg.data)["result"]


async def run_kind(nc: NATS, prefix: str, make: Callable[[], tuple[str, dict[str, Any]]], warmup: float,
                   duration: float, page_two: bool) -> tuple[list[Sample], list[Sample], dict[str, Any]]:
    """Serial queries for warmup + duration; returns first-page and second-page samples and stats."""
    subject = query_subject(prefix, "query")
    first: list[Sample] = []
    second: list[Sample] = []
    empty, items_total, sample_item = 0, 0, None
    begin = time.perf_counter()
    measure_from, end = begin + warmup, begin + warmup + duration
    while (now := time.perf_counter()) < end:
        variant, request = make()
        payload = msgspec.json.encode(request)
        seconds, result = await _ask(nc, subject, payload)
        sample_item = sample_item or (result["items"][0] if result["items"] else None)
        if now >= measure_from:
            first.append((seconds, variant, payload))
            items_total += len(result["items"])
            empty += not result["items"]
        if page_two and result.get("next_cursor"):
            payload2 = msgspec.json.encode({**request, "cursor": result["next_cursor"]})
            seconds2, _ = await _ask(nc, subject, payload2)
            if now >= measure_from:
                second.append((seconds2, variant + ", page 2", payload2))
    return first, second, {"empty_first_pages": empty, "mean_items": round(items_total / max(1, len(first)), 1),
                           "sample_item": sample_item}


def as_result(name: str, samples: list[Sample], duration: float) -> Result:
    result = Result(name, len(samples), duration, [s[0] for s in samples], 1)
    by_variant: dict[str, list[float]] = {}
    for seconds, variant, _ in samples:
        by_variant.setdefault(variant, []).append(seconds)
    result.extra["variants"] = {v: {"n": len(x), "p50_ms": round(statistics.median(x) * 1e3, 3),
                                    "p99_ms": round(sorted(x)[min(len(x) - 1, int(0.99 * len(x)))] * 1e3, 3)}
                                for v, x in sorted(by_variant.items())}
    return result


def cursor_position(request: Any) -> list[Any] | None:
    """The last sort key a second page's cursor carries (the service signed it; the bench only re-reads its
    own requests, so it reads the body without the service's key)."""
    if request.cursor is None:
        return None
    body = request.cursor.split(".")[0]
    return list(msgspec.json.decode(base64.urlsafe_b64decode(body + "=" * (-len(body) % 4)))["k"])


async def sql_only(database_url: str, samples: list[Sample], limit: int = 300) -> Result:
    """The same statements as the service runs for a sample of requests, timed on one direct connection."""
    chosen = samples[:: max(1, len(samples) // limit)][:limit]
    latencies = []
    async with await psycopg.AsyncConnection.connect(database_url, autocommit=True) as conn:
        for _, _, payload in chosen:
            request = decode_query(payload)
            after = cursor_position(request)
            statement, params = build(request, after, None)
            t0 = time.perf_counter()
            await (await conn.execute(statement, params)).fetchall()
            latencies.append(time.perf_counter() - t0)
    return Result("sql only", len(latencies), sum(latencies), latencies, 1)


async def explain_variants(database_url: str, samples: list[Sample]) -> dict[str, Any]:
    """EXPLAIN (ANALYZE, BUFFERS) of the slowest sample of every variant; the full plan of the variant with
    the highest median ("slowest") and a one-line digest of each variant's plan."""
    by_variant: dict[str, list[Sample]] = {}
    for sample in samples:
        by_variant.setdefault(sample[1], []).append(sample)
    medians = {v: statistics.median(s[0] for s in group) for v, group in by_variant.items()}
    out: dict[str, Any] = {"variants": {}}
    async with await psycopg.AsyncConnection.connect(database_url, autocommit=True) as conn:
        for variant, group in sorted(by_variant.items()):
            payload = max(group, key=lambda s: s[0])[2]
            request = decode_query(payload)
            after = cursor_position(request)
            statement, params = build(request, after, None)
            explain = psycopg.sql.SQL("EXPLAIN (ANALYZE, BUFFERS) ") + statement
            plan = [r[0] for r in await (await conn.execute(explain, params)).fetchall()]
            text = "\n".join(plan)
            out["variants"][variant] = {
                "p50_ms": round(medians[variant] * 1e3, 3), "request": payload.decode(),
                "indexes": sorted(set(re.findall(r"(?:Index Scan|Index Only Scan|Bitmap Index Scan)(?: Backward)?"
                                                 r" (?:using|on) (\w+)", text))),
                "seq_scans": sorted(set(re.findall(r"Seq Scan on (\w+)", text))),
                "rows_removed_by_filter": sum(int(x) for x in re.findall(r"Rows Removed by Filter: (\d+)", text)),
                "heap_blocks": sum(int(x) for x in re.findall(r"Heap Blocks: exact=(\d+)", text)),
                "buffers": _top_buffers(plan),
                "sort": sorted(set(re.findall(r"Sort Method: ([\w-]+(?: \w+)?)", text))),
                "execution": next((line for line in plan if line.startswith("Execution Time")), ""),
                "plan": plan, "summary": summarize(plan)}
    slowest = max(medians, key=lambda v: medians[v])
    out["slowest"] = {"variant": slowest, **out["variants"][slowest]}
    return out


def _top_buffers(plan: list[str]) -> int:
    """Shared buffers (hit + read) of the plan's top node: the pages the query touched."""
    line = next((line for line in plan if line.strip().startswith("Buffers: shared")), "")
    return sum(int(x) for x in re.findall(r"(?:hit|read)=(\d+)", line.split(",")[0]))


def summarize(plan: list[str], max_lines: int = 16) -> list[str]:
    """Plan node lines without cost estimates, plus the lines saying what was filtered or sorted."""
    keep = []
    for line in plan:
        text = re.sub(r"\(cost=[^)]*\) ", "", line.rstrip())
        if "->" in text or text.lstrip().startswith(("Limit", "Sort Method", "Rows Removed", "Recheck Cond",
                                                       "Index Cond", "Filter", "Heap Blocks", "Buffers",
                                                       "Execution Time", "Planning Time")):
            keep.append(text[:150])
    return keep[:max_lines] + ([f"... ({len(keep) - max_lines} more lines in the JSON)"] if len(keep) > max_lines else [])
