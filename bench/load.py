"""Closed-loop NATS load: K requests in flight for warm-up + a measured window, or for a fixed count.

Each of K workers sends one request, awaits its reply, checks it, and sends the next. A reply counts
when it is a success and completes inside the measured window; its round trip (perf_counter) goes into
the latency sample. Any error reply or timeout aborts the run: a benchmark that silently counts
failures is worse than none.
"""

from __future__ import annotations

import asyncio
import itertools
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import msgspec
from nats.aio.client import Client as NATS

from pamledger_client.protocol.subjects import command_subject

ACTOR = {"actor_id": "actor:bench:agent", "actor_kind": "agent"}
PROVENANCE = {"provenance_id": "prov:bench:1", "actor": ACTOR, "activity": "bench"}
SCOPE_ID = "scope:bench"
INSERT_SCOPE_SQL = "INSERT INTO scopes (scope_id, scope_kind) VALUES (%s, 'workspace')"  # for benches that skip NATS
REQUEST_TIMEOUT = 30.0
_encoder = msgspec.json.Encoder()

Maker = Callable[[int], tuple[bytes, dict[str, str] | None]]
Checker = Callable[[bytes, bytes], None]


class BadReply(RuntimeError):
    """A reply that is not a success: the benchmark stops and shows it."""


@dataclass
class Result:
    """What one measured window produced."""

    name: str
    ok: int
    seconds: float
    latencies: list[float] = field(repr=False)
    in_flight: int = 1
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def rate(self) -> float:
        return self.ok / self.seconds if self.seconds > 0 else 0.0

    def quantile(self, q: float) -> float:
        """Latency quantile in seconds (nearest rank), NaN without samples."""
        if not self.latencies:
            return float("nan")
        ordered = sorted(self.latencies)
        return ordered[min(len(ordered) - 1, max(0, int(q * len(ordered) + 0.5) - 1))]

    def summary(self) -> dict[str, Any]:
        return {"name": self.name, "ok": self.ok, "seconds": round(self.seconds, 3), "in_flight": self.in_flight,
                "per_second": round(self.rate, 1), "p50_ms": self.quantile(0.5) * 1e3,
                "p99_ms": self.quantile(0.99) * 1e3,
                "mean_ms": statistics.fmean(self.latencies) * 1e3 if self.latencies else None, **self.extra}


def create_payload(text: str = "the benchmark sky is blue") -> bytes:
    """The documented create command: a small claim in the bench scope (object id assigned by the writer)."""
    return _encoder.encode({
        "scope_id": SCOPE_ID, "object_type": "claim", "canonical_content": {"text": text, "confidence": 0.5},
        "actor": ACTOR, "provenance": PROVENANCE,
    })


def create_requests(tag: str) -> Maker:
    """Same small create body each time, a unique Pam-Idempotency-Key per request."""
    payload = create_payload()
    return lambda i: (payload, {"Pam-Idempotency-Key": f"bench:{tag}:{i}"})


def check_result(reply: bytes, request: bytes) -> None:
    """pamledger replies are canonical JSON, so a success starts with its only key, "result"."""
    if not reply.startswith(b'{"result":'):
        raise BadReply(f"error reply: {reply[:600].decode(errors='replace')}")


class _Created(msgspec.Struct):
    ledger_sequence: int


class _CreateReply(msgspec.Struct):
    result: _Created | None = None
    error: dict[str, Any] | None = None


_decode_create_reply = msgspec.json.Decoder(_CreateReply).decode


def created_sequence(reply: bytes) -> int:
    """The ledger_sequence of a successful create reply; BadReply (with the reply) for anything else."""
    decoded = _decode_create_reply(reply)
    if decoded.result is None:
        raise BadReply(f"error reply: {reply[:400].decode(errors='replace')}")
    return decoded.result.ledger_sequence


def check_echo(reply: bytes, request: bytes) -> None:
    if reply != request:
        raise BadReply(f"echo mismatch: {reply[:200]!r}")


async def create_scope(nc: NATS, prefix: str, scope_id: str = SCOPE_ID) -> None:
    body = _encoder.encode({"scope_id": scope_id, "scope_kind": "workspace"})
    msg = await nc.request(command_subject(prefix, "create_scope"), body, timeout=REQUEST_TIMEOUT)
    check_result(msg.data, body)


async def drive(nc: NATS, subject: str, name: str, make: Maker, check: Checker, in_flight: int,
                warmup: float, duration: float) -> Result:
    """K in flight for warmup+duration seconds; count successes completed in the last `duration`."""
    counter = itertools.count()
    latencies: list[float] = []
    start = time.perf_counter() + warmup
    end = start + duration

    async def worker() -> None:
        while time.perf_counter() < end:
            payload, headers = make(next(counter))
            t0 = time.perf_counter()
            msg = await nc.request(subject, payload, timeout=REQUEST_TIMEOUT, headers=headers)
            t1 = time.perf_counter()
            check(msg.data, payload)
            if start <= t1 <= end:
                latencies.append(t1 - t0)

    await _run_workers(worker, in_flight)
    return Result(name, len(latencies), duration, latencies, in_flight, {"sent": next(counter)})


async def drive_count(nc: NATS, subject: str, name: str, make: Maker, check: Checker, in_flight: int,
                      total: int, marks: dict[int, Callable[[], None]]) -> Result:
    """K in flight until `total` successes; marks[n]() runs right after the n-th success (e.g. an RSS probe)."""
    counter = itertools.count()
    latencies: list[float] = []
    t_start = time.perf_counter()

    async def worker() -> None:
        while (i := next(counter)) < total:
            payload, headers = make(i)
            t0 = time.perf_counter()
            msg = await nc.request(subject, payload, timeout=REQUEST_TIMEOUT, headers=headers)
            latencies.append(time.perf_counter() - t0)
            check(msg.data, payload)
            mark = marks.get(len(latencies))
            if mark is not None:
                mark()

    await _run_workers(worker, in_flight)
    return Result(name, len(latencies), time.perf_counter() - t_start, latencies, in_flight)


async def _run_workers(worker: Callable[[], Any], in_flight: int) -> None:
    """Run K workers; the first failure cancels the others and propagates."""
    tasks = [asyncio.create_task(worker()) for _ in range(in_flight)]
    try:
        await asyncio.gather(*tasks)
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
