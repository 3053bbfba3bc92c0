"""Subscribe live latency: one SDK push subscriber, creates paced open loop; reply (after COMMIT) -> delivered.

A fresh service on a fresh database; one scope; `MemoryClient.subscribe(scope, actor)` without
`after_sequence` (new events only) on its own NATS connection, iterated by a task that notes the
monotonic time each event is handed out. Creates are sent at `rate`/s (bench.pace) on another
connection; per create in the measured window, lag = time the subscriber got its event (matched by
ledger_sequence) - time its reply arrived. The NATS echo round trip (bench.echo, serial, create-sized
payload) is measured in the same run as the floor.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from typing import Any

from nats.aio.client import Client as NATS
from nats.aio.msg import Msg

from bench.load import ACTOR, create_payload, create_scope
from bench.pace import Paced, create_bodies, lag_stats, paced_creates
from bench.servers import Servers
from bench.service import serial_echo
from bench.subscribe_service import Log, log_signs, log_watches, sdk_events, service_on, stop_task
from pamledger_client.client import MemoryClient
from pamledger_client.subscription import Subscription

SCOPE = "workspace:m3-live"


async def _consume(subscription: Subscription, received: dict[int, float]) -> None:
    """Iterate the SDK subscription, noting when each event arrived (until cancelled)."""
    async with contextlib.aclosing(sdk_events(subscription)) as events:
        async for event in events:
            received.setdefault(int(event["ledger_sequence"]), time.monotonic())


async def _wait_delivered(received: dict[int, float], sequences: list[int], timeout: float) -> float:
    """Wait (bounded) until every sequence was received; seconds waited."""
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout and any(s not in received for s in sequences):
        await asyncio.sleep(0.05)
    return time.monotonic() - t0


async def _tap(nc: NATS, prefix: str, seen: dict[int, float]) -> Any:
    """A core-NATS subscription on the ledger subjects: when the relay's publish of each event arrived."""
    async def noted(msg: Msg) -> None:
        seen.setdefault(int((msg.headers or {}).get("Pam-Ledger-Sequence", 0)), time.monotonic())

    return await nc.subscribe(f"{prefix}.ledger.>", cb=noted, pending_msgs_limit=1_000_000)


def summarize(paced: Paced, received: dict[int, float], relayed: dict[int, float]) -> dict[str, Any]:
    """Reply latency, reply -> relay publish seen, and reply -> delivery lag over the measured window."""
    measured = paced.measured()
    lags = [(received[c.sequence] - c.replied) * 1e3 for c in measured if c.sequence in received]
    relay = [(relayed[c.sequence] - c.replied) * 1e3 for c in measured if c.sequence in relayed]
    gateway = [(received[c.sequence] - relayed[c.sequence]) * 1e3 for c in measured
               if c.sequence in received and c.sequence in relayed]
    return {"rate": paced.rate, "sent": paced.sent, "measured_creates": len(measured), "sustained": paced.sustained,
            "stopped": paced.stopped, "max_sender_delay_ms": paced.max_sender_delay_ms,
            "missing": sum(1 for c in measured if c.sequence not in received),
            "delivered_before_reply": sum(1 for x in lags if x < 0),
            "lag": lag_stats(lags), "relay": lag_stats(relay), "relay_to_delivery": lag_stats(gateway),
            "reply": lag_stats([(c.replied - c.scheduled) * 1e3 for c in measured])}


async def live_benchmark(servers: Servers, rate: float, warmup: float, duration: float, log: Log,
                         echo: bool = True) -> dict[str, Any]:
    """One subscriber, `rate` creates/s for warmup + duration seconds; then (unless told not to) the echo
    baseline."""
    db_name, url = servers.fresh_database("m3live")
    try:
        async with service_on(servers, url, "m3live") as (nc, prefix, _stream, child):
            await create_scope(nc, prefix, SCOPE)
            client = await MemoryClient.connect(servers.nats_url, prefix, timeout=30.0)
            try:
                subscription = await client.subscribe(SCOPE, ACTOR)
                received: dict[int, float] = {}
                relayed: dict[int, float] = {}
                tap = await _tap(nc, prefix, relayed)
                consumer = asyncio.create_task(_consume(subscription, received))
                try:
                    log(f"live: one SDK subscriber; {rate:g} creates/s open loop for {warmup:g}+{duration:g} s")
                    watches = log_watches(servers, child)
                    cpu0, t0, own0 = child.cpu_seconds(), time.monotonic(), time.process_time()
                    paced = await paced_creates(nc, prefix, create_bodies([SCOPE]), lambda i: 0, rate, warmup,
                                                duration, f"live{time.monotonic_ns()}")
                    wall = time.monotonic() - t0
                    cpu_share = ((child.cpu_seconds() - cpu0) / wall, (time.process_time() - own0) / wall)
                    drained = await _wait_delivered(received, [c.sequence for c in paced.creates], 30.0)
                    signs = log_signs(watches)
                    if consumer.done():
                        consumer.result()  # surfaces an iterator failure
                finally:
                    await stop_task(consumer)
                await tap.unsubscribe()
                await subscription.close("unsubscribed")
            finally:
                await client.close()
        out = summarize(paced, received, relayed)
        out.update(service_cpu_share=round(cpu_share[0], 2), bench_cpu_share=round(cpu_share[1], 2),
                   drain_after_last_reply_s=round(drained, 3), log_signs=signs)
        log(f"live: lag p50 {out['lag']['p50_ms']:.2f} ms, p99 {out['lag']['p99_ms']:.2f} ms; echo baseline ...")
    finally:
        servers.drop_database(db_name)
    if echo:
        out["echo"] = await serial_echo(servers, "m3echo", create_payload(), 2.0)
    return out
