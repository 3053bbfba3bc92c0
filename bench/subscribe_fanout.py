"""Subscribe fan-out: many open push subscriptions on one gateway while creates flow into their scopes.

A fresh service; `scopes` scopes with `per_scope` push subscriptions each, opened with raw
`{prefix}.sub.open` requests (a bounded number in flight). The subscribers are raw nats-py protocol
clients (bench.subscribe_fleet: one wildcard subscription for all, gap -> resume, cumulative plain-publish acks
every 50 ms), not SDK iterators: one iterator task per subscriber would make the bench, not the
gateway, the bottleneck.

Creates go out at `rate`/s open loop, round-robin over the scopes (bench.pace; sending stops early only
past five seconds of unanswered creates, so a service that falls behind shows it). Verdicts: every
subscriber received every create of its scope (no gap, no close); "without falling behind": deliveries
per second during the window >= 95% of what the create rate needs (rate x subscriptions per scope) and
lag (received - create reply) not growing over the window (p99 of its last third <= 1.5 x p99 of its
first third + 10 ms).
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import msgspec
import nats
import psycopg
from nats.aio.client import Client as NATS

from bench.load import ACTOR, REQUEST_TIMEOUT, BadReply, create_scope
from bench.pace import Paced, create_bodies, lag_stats, paced_creates, quantile
from bench.servers import Servers
from bench.subscribe_fleet import Fleet, Subscriber
from bench.subscribe_service import Log, connect, idle_cpu, listener_pid, log_signs, log_watches, service_on

GROWTH_FACTOR, GROWTH_SLACK_MS = 1.5, 10.0
KEEP_UP = 0.95  # deliveries per second during the window, as a share of what the create rate needs


async def open_all(nc: NATS, prefix: str, fleet: Fleet, scopes: list[str], per_scope: int, in_flight: int
                   ) -> dict[str, Any]:
    """Open per_scope push subscriptions in every scope, `in_flight` requests at a time.

    An error reply or a timeout is counted, not retried (a retried open is a new subscription), and the
    benchmark goes on with the subscriptions that did open.
    """
    gate = asyncio.Semaphore(in_flight)
    latencies: list[float] = []
    failures: list[str] = []

    async def one(k: int) -> None:
        scope = k % len(scopes)
        body = msgspec.json.encode({"scope_id": scopes[scope], "actor": ACTOR,
                                    "delivery": {"mode": "push", "keepalive_interval_ms": 2000}})
        async with gate:
            t0 = time.perf_counter()
            try:
                msg = await nc.request(f"{prefix}.sub.open", body, timeout=REQUEST_TIMEOUT)
            except nats.errors.TimeoutError:
                failures.append("timeout")
                return
            latencies.append(time.perf_counter() - t0)
        reply = msgspec.json.decode(msg.data)
        if "result" not in reply:
            failures.append(str(reply.get("error", {}).get("message", msg.data[:200])))
            return
        result = reply["result"]
        fleet.register(result["delivery_subject"].rsplit(".", 1)[-1], Subscriber(
            scope, result["subscription_id"], int(result["start_sequence"]), int(result["generation"])))

    t0 = time.perf_counter()
    await asyncio.gather(*(one(k) for k in range(len(scopes) * per_scope)))
    seconds = time.perf_counter() - t0
    if not fleet.by_token:
        raise BadReply(f"no subscription opened: {failures[:3]}")
    return {"requested": len(scopes) * per_scope, "subscriptions": len(fleet.by_token), "failed": len(failures),
            "failure_messages": sorted(set(failures)), "seconds": round(seconds, 2), "in_flight": in_flight,
            "opens_per_second": round(len(fleet.by_token) / seconds, 1),
            "p50_ms": quantile(latencies, 0.5) * 1e3, "p99_ms": quantile(latencies, 0.99) * 1e3}


async def open_bookkeeping(nc: NATS, stream: str, database_url: str) -> dict[str, Any]:
    """What the service recorded for the opens: subscription rows by status, subscription_opened ledger
    entries, and the stream's consumer count (each subscription owns a durable consumer)."""
    async with await psycopg.AsyncConnection.connect(database_url, autocommit=True) as conn:
        rows = await (await conn.execute("SELECT status, count(*) FROM subscriptions GROUP BY status")).fetchall()
        opened = await (await conn.execute(
            "SELECT count(*) FROM ledger WHERE event_type = 'subscription_opened'")).fetchone()
    info = await nc.jetstream().stream_info(stream)
    return {"subscription_rows": {str(r[0]): int(r[1]) for r in rows},
            "subscription_opened_entries": int(opened[0]) if opened else 0,
            "stream_consumers": int(info.state.consumer_count),
            "stream_max_consumers": info.config.max_consumers}


def expected_by_scope(paced: Paced, scopes: int) -> list[list[int]]:
    out: list[list[int]] = [[] for _ in range(scopes)]
    for c in paced.creates:
        out[c.scope].append(c.sequence)
    return out


def undelivered(fleet: Fleet, expected: list[list[int]]) -> int:
    return sum(1 for s in fleet.by_token.values() for q in expected[s.scope] if q not in s.times)


async def wait_delivered(fleet: Fleet, expected: list[list[int]], timeout: float) -> tuple[float, int]:
    """Wait (bounded) until every subscriber has every create of its scope: (seconds, still missing)."""
    t0 = time.monotonic()
    missing = undelivered(fleet, expected)
    while missing and time.monotonic() - t0 < timeout:
        await asyncio.sleep(0.1)
        missing = undelivered(fleet, expected)
    return time.monotonic() - t0, missing


def evaluate(fleet: Fleet, paced: Paced, missing: int) -> dict[str, Any]:
    """Completeness, lag overall and per third of the measured window, and the growth verdict."""
    measured = paced.measured()
    replied = {c.sequence: c for c in measured}
    w0 = paced.window[0]  # thirds of what was actually sent in the window (sending may have stopped early)
    w1 = max((c.scheduled for c in measured), default=paced.window[1]) + 1 / paced.rate
    thirds: list[list[float]] = [[], [], []]
    created = {c.sequence for c in paced.creates}
    in_window = 0  # deliveries of any create that arrived during the window: the delivery rate achieved
    for s in fleet.by_token.values():
        for sequence, at in s.times.items():
            in_window += w0 <= at < w1 and sequence in created
            c = replied.get(sequence)
            if c is not None and c.scope == s.scope:
                part = min(2, int(3 * (c.scheduled - w0) / (w1 - w0)))
                thirds[part].append((at - c.replied) * 1e3)
    subs = list(fleet.by_token.values())
    first, last = lag_stats(thirds[0]), lag_stats(thirds[2])
    grew = not last["p99_ms"] <= GROWTH_FACTOR * first["p99_ms"] + GROWTH_SLACK_MS
    required = len(measured) * len(subs) / max(1, len({c.scope for c in paced.creates})) / (w1 - w0)
    achieved = in_window / (w1 - w0)
    return {"missing_deliveries": missing, "gaps": sum(s.gaps for s in subs), "resumes": sum(s.resumes for s in subs),
            "resume_failures": fleet.resume_failures,
            "duplicates": sum(s.duplicates for s in subs), "closed": sum(1 for s in subs if s.closed),
            "close_reasons": sorted({s.closed for s in subs if s.closed}), "keepalives": fleet.keepalives,
            "lag": lag_stats(thirds[0] + thirds[1] + thirds[2]), "lag_first_third": first,
            "lag_middle_third": lag_stats(thirds[1]), "lag_last_third": last, "lag_grew": grew,
            "deliveries_per_second": round(achieved), "deliveries_per_second_needed": round(required),
            "keeps_up": not grew and achieved >= KEEP_UP * required,
            "complete": missing == 0 and not any(s.closed for s in subs)}


async def fanout_benchmark(servers: Servers, scopes: int, per_scope: int, rate: float, warmup: float,
                           duration: float, log: Log, open_in_flight: int = 32) -> dict[str, Any]:
    """Open scopes x per_scope subscriptions, drive `rate` creates/s over the scopes, check every delivery."""
    names = [f"workspace:m3-fan-{i:03d}" for i in range(scopes)]
    db_name, url = servers.fresh_database("m3fan")
    out: dict[str, Any] = {"scopes": scopes, "per_scope": per_scope, "rate": rate,
                           "subscriber": "raw nats-py protocol clients (bench.subscribe_fleet: one wildcard"
                                         " subscription, resume on gap, plain-publish acks every 50 ms)"}
    try:
        async with service_on(servers, url, "m3fan") as (nc, prefix, stream, child):
            await asyncio.gather(*(create_scope(nc, prefix, s) for s in names))
            sub_nc = await connect(servers.nats_url, "pamledger-bench-m3-fleet")
            fleet = Fleet(sub_nc, prefix)
            try:
                await fleet.start()
                log(f"fan-out: opening {scopes * per_scope} subscriptions ({open_in_flight} in flight) ...")
                out["open"] = await open_all(nc, prefix, fleet, names, per_scope, open_in_flight)
                out["open"].update(await open_bookkeeping(nc, stream, url))
                if out["open"]["failed"]:
                    log(f"fan-out: {out['open']['failed']} opens FAILED ({out['open']['failure_messages']});"
                        f" the stream has {out['open']['stream_consumers']} consumers; going on with"
                        f" {out['open']['subscriptions']}")
                log(f"fan-out: opened in {out['open']['seconds']} s; {rate:g} creates/s for {warmup:g}+{duration:g} s")
                await asyncio.sleep(1.0)  # let the new pumps settle (first fetches, keepalives)
                out["idle_cpu_share"] = await idle_cpu(child, listener_pid(servers.nats_url), 3.0)
                log(f"fan-out: idle CPU share with every subscription open: {out['idle_cpu_share']}")
                watches = log_watches(servers, child)
                cpu0, own0, t0 = child.cpu_seconds(), time.process_time(), time.monotonic()
                paced = await paced_creates(nc, prefix, create_bodies(names, "m3 fan-out event"),
                                            lambda i: i % scopes, rate, warmup, duration, f"fan{time.monotonic_ns()}",
                                            max_backlog=5.0)
                wall = time.monotonic() - t0
                out.update(service_cpu_share=round((child.cpu_seconds() - cpu0) / wall, 2),
                           bench_cpu_share=round((time.process_time() - own0) / wall, 2))
                expected = expected_by_scope(paced, scopes)
                out["undelivered_at_last_reply"] = undelivered(fleet, expected)
                drain, missing = await wait_delivered(fleet, expected, 60.0)
                out.update(drain_after_last_reply_s=round(drain, 2), sent=paced.sent, sustained=paced.sustained,
                           stopped=paced.stopped, max_sender_delay_ms=paced.max_sender_delay_ms,
                           reply=lag_stats([(c.replied - c.scheduled) * 1e3 for c in paced.measured()]),
                           expected_deliveries=sum(len(e) for e in expected) * per_scope)
                out.update(evaluate(fleet, paced, missing))
                out["log_signs"] = log_signs(watches)
            finally:
                await fleet.stop()
                await sub_nc.close()
        log(f"fan-out: complete={out['complete']} lag p50 {out['lag']['p50_ms']:.1f} ms,"
            f" p99 {out['lag']['p99_ms']:.1f} ms, grew={out['lag_grew']}")
        return out
    finally:
        servers.drop_database(db_name)
