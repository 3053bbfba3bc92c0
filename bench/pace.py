"""Open-loop paced creates for the subscribe (live, fan-out) and indexing (freshness) benchmarks.

Creates go out on a fixed schedule (`rate` per second; a slow reply never delays the next send), each
to the scope `scope_of(i)` with a unique idempotency key. Per create the bench records the monotonic
time it was scheduled, the time its reply arrived (the writer replies after COMMIT) and the
`ledger_sequence` the reply names: subscribers' receive times are compared with the reply time of the
event's create. If the service cannot keep up (more than `max_backlog` seconds of sends outstanding, a
create unanswered for REPLY_TIMEOUT, or the sender 250 ms behind schedule) sending stops early; a run is
sustained when sending ran to the end and nearly every create of the window was answered by the
window's end + 1 s.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import msgspec
import nats
from nats.aio.client import Client as NATS

from bench.load import ACTOR, PROVENANCE, created_sequence
from pamledger_client.protocol.subjects import command_subject


REPLY_TIMEOUT = 30.0


@dataclass
class Sent:
    """One create: index, scope index, scheduled and reply times (monotonic s), its ledger sequence."""

    index: int
    scope: int
    scheduled: float
    replied: float
    sequence: int


@dataclass
class Paced:
    """What one paced run produced; `window` is the measured (monotonic) interval of scheduled times."""

    rate: float
    window: tuple[float, float]
    creates: list[Sent] = field(default_factory=list)
    sent: int = 0
    stopped: str = ""
    max_sender_delay_ms: float = 0.0

    @property
    def sustained(self) -> bool:
        """Sending ran to the end and >= 97% of the window's creates were answered by its end + 1 s."""
        answered = sum(1 for c in self.measured() if c.replied <= self.window[1] + 1.0)
        wanted = self.rate * (self.window[1] - self.window[0])
        return not self.stopped and answered >= 0.97 * wanted

    def measured(self) -> list[Sent]:
        return [c for c in self.creates if self.window[0] <= c.scheduled < self.window[1]]


def create_bodies(scopes: list[str], text: str = "m3 live event") -> list[bytes]:
    """One pre-encoded create (a small claim) per scope."""
    return [msgspec.json.encode({"scope_id": s, "object_type": "claim", "actor": ACTOR, "provenance": PROVENANCE,
                                 "canonical_content": {"text": text, "confidence": 0.5}}) for s in scopes]


async def paced_creates(nc: NATS, prefix: str, bodies: list[bytes], scope_of: Callable[[int], int], rate: float,
                        warmup: float, duration: float, tag: str, max_backlog: float = 1.0) -> Paced:
    """Send creates at `rate`/s for warmup + duration seconds (open loop); wait (bounded) for every reply."""
    subject = command_subject(prefix, "create")
    total = int(rate * (warmup + duration))
    t0 = time.monotonic() + 0.05
    out = Paced(rate, (t0 + warmup, t0 + warmup + duration))
    failures: list[BaseException] = []
    timeouts: list[int] = []  # creates unanswered after REPLY_TIMEOUT: recorded, and sending stops
    outstanding: set[asyncio.Task[None]] = set()

    async def one(i: int, scheduled: float) -> None:
        scope = scope_of(i)
        try:
            msg = await nc.request(subject, bodies[scope], timeout=REPLY_TIMEOUT,
                                   headers={"Pam-Idempotency-Key": f"bench:m3:{tag}:{i}"})
            replied = time.monotonic()
            out.creates.append(Sent(i, scope, scheduled, replied, created_sequence(msg.data)))
        except nats.errors.TimeoutError:
            timeouts.append(i)
        except BaseException as exc:  # noqa: BLE001 - reported after the run
            failures.append(exc)

    i = 0
    while i < total and not failures and not timeouts:
        now = time.monotonic()
        due = t0 + i / rate
        if due > now:
            await asyncio.sleep(due - now)
            continue
        behind = now - due
        out.max_sender_delay_ms = max(out.max_sender_delay_ms, round(behind * 1e3, 1))
        if len(outstanding) > rate * max_backlog or behind > 0.25:
            out.stopped = (f"backlog of {len(outstanding)} requests" if len(outstanding) > rate * max_backlog
                           else f"sender {behind * 1e3:.0f} ms behind schedule")
            break
        while i < total and t0 + i / rate <= now:
            task = asyncio.create_task(one(i, t0 + i / rate))
            outstanding.add(task)
            task.add_done_callback(outstanding.discard)
            i += 1
    out.sent = i
    if outstanding:
        _, late = await asyncio.wait(set(outstanding), timeout=REPLY_TIMEOUT + 5)
        for task in late:
            task.cancel()
    if failures:
        raise failures[0]
    if timeouts:
        out.stopped = f"{len(timeouts)} creates unanswered after {REPLY_TIMEOUT:g} s (first: #{min(timeouts)})"
    out.creates.sort(key=lambda c: c.sequence)
    return out


def quantile(values: list[float], q: float) -> float:
    """Nearest-rank quantile; NaN when empty."""
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, int(q * len(ordered) + 0.5) - 1))]


def lag_stats(lags_ms: list[float]) -> dict[str, Any]:
    """p50 / p99 / max (ms) and the count of a list of lags in milliseconds."""
    return {"n": len(lags_ms), "p50_ms": quantile(lags_ms, 0.5), "p99_ms": quantile(lags_ms, 0.99),
            "max_ms": max(lags_ms) if lags_ms else float("nan")}
