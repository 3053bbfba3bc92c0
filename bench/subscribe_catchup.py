"""Subscribe catch-up: one subscriber reads a whole scope's history from `after_sequence=0`, SDK vs raw JetStream.

The ledger (one scope) is bulk-loaded into a fresh database (bench.ledger_loader, the writer's own core
decides every event); the real service then starts on it with no stream, so its relay republishes every
row into a new JetStream stream (stream seq == ledger seq). Once relay and projector report the head,
the same events are read, one reader at a time, by:

- raw JetStream: a pull consumer (`js.pull_subscribe`, deliver_policy all, the gateway's subject filter
  for the scope) doing fetch(500) and msgspec-decoding every body; AckPolicy.ALL acking the last message
  of each batch (what the gateway's own consumers do), before and after the SDK run (the faster counts),
  and once with AckPolicy.EXPLICIT acking every message;
- the SDK: `MemoryClient.subscribe(scope, actor, after_sequence=0)` and `async for` until the event at
  the head arrived (the SDK acks cumulatively in the background). Its time includes the open request.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from typing import Any

import msgspec
import psycopg
from nats.aio.client import Client as NATS
from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy
from nats.js.errors import NotFoundError

from bench.ledger_loader import LoadSpec, load_ledger, scope_ids
from bench.load import ACTOR
from bench.servers import Servers
from bench.subscribe_service import Log, connect, sdk_events, service_on, stop_task, wait_settled
from pamledger_client.protocol.subjects import scope_token
from pamledger_client.client import MemoryClient

_decode = msgspec.json.Decoder(dict[str, Any]).decode
# The ledger head as the gateway asked for it on every open before commit 2d083af (max() over the whole
# ledger), and as it asks now (through the (partition, ledger_sequence) key).
HEAD_QUERIES = (("unkeyed", "SELECT coalesce(max(ledger_sequence), 0) FROM ledger"),
                ("keyed", "SELECT coalesce(max(ledger_sequence), 0) FROM ledger WHERE partition = 0"))


async def raw_read(nc: NATS, stream: str, subject: str, head: int, ack_all: bool, timeout: float) -> dict[str, Any]:
    """Read every event up to `head` with a pull consumer, fetch(500), decoding each body."""
    js = nc.jetstream()
    durable = f"bench_raw_{uuid.uuid4().hex[:10]}"
    config = ConsumerConfig(durable_name=durable, deliver_policy=DeliverPolicy.ALL, max_ack_pending=-1,
                            ack_policy=AckPolicy.ALL if ack_all else AckPolicy.EXPLICIT, ack_wait=600)
    count, last = 0, 0
    t0 = time.perf_counter()
    cpu0 = time.process_time()
    sub = await js.pull_subscribe(subject, durable=durable, stream=stream, config=config)
    try:
        async with asyncio.timeout(timeout):
            while last < head:
                msgs = await sub.fetch(500, timeout=5)
                for msg in msgs:
                    _decode(msg.data)
                    last = msg.metadata.sequence.stream
                    count += 1
                    if not ack_all:
                        await msg.ack()
                if ack_all and msgs:
                    await msgs[-1].ack()
        seconds = time.perf_counter() - t0
    finally:
        with contextlib.suppress(Exception):
            await sub.unsubscribe()
        with contextlib.suppress(NotFoundError, Exception):
            await js.delete_consumer(stream, durable)
    return {"events": count, "seconds": round(seconds, 3), "events_per_second": round(count / seconds, 1),
            "ack": "all (last of each batch)" if ack_all else "explicit (every message)",
            "bench_cpu_seconds": round(time.process_time() - cpu0, 2)}


async def sdk_read(url: str, prefix: str, scope: str, head: int, timeout: float) -> dict[str, Any]:
    """Subscribe through the SDK from after_sequence=0 and iterate until the event at `head` arrived."""
    client = await MemoryClient.connect(url, prefix, timeout=30.0)
    seen = {"count": 0, "last": 0, "in_order": True, "first_at": 0.0}
    t0 = time.perf_counter()
    cpu0 = time.process_time()

    async def read_all(subscription: Any) -> None:
        async with contextlib.aclosing(sdk_events(subscription)) as events:
            async for event in events:
                sequence = int(event["ledger_sequence"])
                seen["in_order"] = seen["in_order"] and sequence > seen["last"]
                seen["last"] = sequence
                seen["count"] += 1
                seen["first_at"] = seen["first_at"] or time.perf_counter() - t0
                if sequence >= head:
                    return

    try:
        subscription = await client.subscribe(scope, ACTOR, after_sequence=0)
        opened = time.perf_counter() - t0
        reader = asyncio.create_task(read_all(subscription))
        try:  # asyncio.wait, not wait_for: a Ctrl-C cancelling this task always gets through
            done, _ = await asyncio.wait({reader}, timeout=timeout)
            if not done:
                raise TimeoutError(f"SDK catch-up got {seen['count']} of {head} events in {timeout:g} s")
            reader.result()
        finally:
            await stop_task(reader)
        seconds = time.perf_counter() - t0
        cpu = time.process_time() - cpu0
        await subscription.close("unsubscribed")
    finally:
        await client.close()
    count = int(seen["count"])
    return {"events": count, "seconds": round(seconds, 3), "events_per_second": round(count / seconds, 1),
            "open_seconds": round(opened, 4), "first_event_seconds": round(float(seen["first_at"]), 4),
            "in_order": bool(seen["in_order"]), "last_sequence": seen["last"], "bench_cpu_seconds": round(cpu, 2)}


def explain_head_query(database_url: str) -> dict[str, Any]:
    """The per-open ledger head query on this ledger, unkeyed and keyed: mean time over 5 runs and plan."""
    out: dict[str, Any] = {}
    with psycopg.connect(database_url, autocommit=True) as conn:
        for name, query in HEAD_QUERIES:
            conn.execute(query)  # warm
            t0 = time.perf_counter()
            for _ in range(5):
                conn.execute(query).fetchone()
            plan = conn.execute("EXPLAIN (ANALYZE, COSTS OFF, TIMING OFF, SUMMARY ON) " + query).fetchall()
            out[name] = {"mean_ms": round((time.perf_counter() - t0) / 5 * 1e3, 2),
                         "plan": [r[0] for r in plan]}
    return out


def catchup_benchmark(servers: Servers, events: int, log: Log) -> dict[str, Any]:
    """Load `events` events into one scope, replicate them, then SDK vs raw catch-up reads."""
    db_name, url = servers.fresh_database("m3cu", migrated=False)
    try:
        log(f"catch-up: loading {events:,} events into one scope ...")
        load = load_ledger(url, LoadSpec(events=events, scopes=1))
        log(f"catch-up: loaded in {load['seconds']} s ({load['events_per_second']:,} events/s); starting the"
            " service (its relay republishes the ledger into a new stream)")
        out: dict[str, Any] = {"load": {k: load[k] for k in ("events", "objects", "seconds", "events_per_second")},
                               "head_query": explain_head_query(url)}
        out.update(asyncio.run(_measure(servers, url, int(load["head_sequence"]), scope_ids(1)[0], log)))
        return out
    finally:
        servers.drop_database(db_name)


async def _measure(servers: Servers, url: str, head: int, scope: str, log: Log) -> dict[str, Any]:
    async with service_on(servers, url, "m3cu") as (nc, prefix, stream, child):
        replication = await wait_settled(nc, prefix, url, head, child, log)
        log(f"catch-up: relay and projector at the head after {replication['settled_seconds']} s")
        subject = f"{prefix}.ledger.p0.{scope_token(scope)}.>"
        budget = max(120.0, head / 500)
        raw_nc = await connect(servers.nats_url, "pamledger-bench-m3-raw")
        try:
            log("catch-up: raw JetStream pull consumer (AckPolicy.ALL) ...")
            raw1 = await raw_read(raw_nc, stream, subject, head, True, budget)
            log(f"catch-up: raw {raw1['events_per_second']:,} events/s; now the SDK subscriber ...")
            cpu0 = child.cpu_seconds()
            sdk = await sdk_read(servers.nats_url, prefix, scope, head, budget)
            sdk["service_cpu_seconds"] = round(child.cpu_seconds() - cpu0, 2)
            log(f"catch-up: SDK {sdk['events_per_second']:,} events/s; raw again, then explicit acks ...")
            raw2 = await raw_read(raw_nc, stream, subject, head, True, budget)
            raw_explicit = await raw_read(raw_nc, stream, subject, head, False, budget)
        finally:
            await raw_nc.close()
    best = max(raw1, raw2, key=lambda r: r["events_per_second"])
    return {"replication": replication, "head": head, "scope": scope, "sdk": sdk, "raw_runs": [raw1, raw2],
            "raw": best, "raw_explicit": raw_explicit,
            "ratio": round(sdk["events_per_second"] / best["events_per_second"], 3),
            "complete": sdk["events"] == head and best["events"] == head and sdk["in_order"]}
