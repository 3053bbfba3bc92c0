"""Projection lag: open-loop paced creates through the real service; reply-to-queryable time per create.

The service (`python -m pamledger run`: writer + relay + projector + query) runs in its own process
on a fresh database (bench.scenarios.pamledger_service). The bench sends creates on a fixed schedule
(open loop: a slow reply never delays the next send) and records, per create, the monotonic time its
reply arrived (after COMMIT) and its ledger_sequence. A separate process (bench.projection_listen) LISTENs on
`pamledger_projection`, where the projector NOTIFYs each new checkpoint at COMMIT, and logs arrival
times. An object is queryable from the first checkpoint >= its ledger_sequence; lag = that time minus
the reply time (0 when the projection was already there). If 5,000/s cannot be sustained (backlog over
one second of sends, or the sender falling behind its schedule), the service's closed-loop capacity is
measured (64 in flight, as scenario a) and open loop is retried at 80% of it, then at 70% of that; the
highest sustained rate is reported with its lag.
"""

from __future__ import annotations

import asyncio
import bisect
import time
from pathlib import Path
from typing import Any

from nats.aio.client import Client as NATS

from bench.load import Result, check_result, create_requests, created_sequence, drive
from bench.procs import python_child
from bench.projection_explain import commit_stats, explain_projector_batch
from bench.scenarios import Config, pamledger_service, writer_status
from bench.servers import Servers
from pamledger_client.protocol.subjects import command_subject

TARGET_RATE = 5000
MAX_ATTEMPTS = 3




async def open_loop(nc: NATS, prefix: str, rate: float, warmup: float, duration: float) -> dict[str, Any]:
    """Send creates at `rate`/s for warmup + duration; returns the replies of the measured window."""
    subject = command_subject(prefix, "create")
    make = create_requests(f"m2lag{rate:.0f}{time.monotonic_ns()}")
    total = int(rate * (warmup + duration))
    samples: list[tuple[float, float, int]] = []  # (scheduled, reply time, ledger_sequence)
    failures: list[BaseException] = []
    outstanding: set[asyncio.Task[None]] = set()
    t0 = time.monotonic() + 0.05
    window = (t0 + warmup, t0 + warmup + duration)
    max_behind, stopped = 0.0, ""

    async def one(i: int, scheduled: float) -> None:
        payload, headers = make(i)
        try:
            msg = await nc.request(subject, payload, timeout=30, headers=headers)
            replied = time.monotonic()
            sequence = created_sequence(msg.data)
            if window[0] <= scheduled < window[1]:
                samples.append((scheduled, replied, sequence))
        except BaseException as exc:  # noqa: BLE001 - reported after the run
            failures.append(exc)

    i = 0
    while i < total and not failures:
        now = time.monotonic()
        due = t0 + i / rate
        if due > now:
            await asyncio.sleep(due - now)
            continue
        max_behind = max(max_behind, now - due)
        if len(outstanding) > rate or max_behind > 0.25:
            stopped = f"backlog {len(outstanding)} requests" if len(outstanding) > rate else \
                f"sender {max_behind * 1e3:.0f} ms behind schedule"
            break
        while i < total and t0 + i / rate <= now:
            task = asyncio.create_task(one(i, t0 + i / rate))
            outstanding.add(task)
            task.add_done_callback(outstanding.discard)
            i += 1
    sent_until = time.monotonic()
    if outstanding:
        await asyncio.wait(set(outstanding), timeout=60)
    if failures:
        raise failures[0]
    replies_in_window = [s for s in samples if s[1] <= window[1]]
    achieved = len(replies_in_window) / duration
    sustained = not stopped and achieved >= 0.97 * rate
    return {"rate": rate, "sent": i, "samples": samples, "sustained": sustained, "stopped": stopped,
            "achieved_replies_per_second": round(achieved, 1), "max_sender_delay_ms": round(max_behind * 1e3, 1),
            "send_seconds": round(sent_until - t0, 2)}


def read_checkpoints(path: Path) -> tuple[list[float], list[int]]:
    """(times, checkpoints) from the listener's log, checkpoints made non-decreasing."""
    times: list[float] = []
    points: list[int] = []
    for line in path.read_text().splitlines():
        parts = line.split()
        if len(parts) == 2:
            times.append(float(parts[0]))
            points.append(max(int(parts[1]), points[-1] if points else 0))
    return times, points


def covered_at(times: list[float], points: list[int], sequence: int) -> float | None:
    """When the first mark covering `sequence` came (`points` non-decreasing, `times` beside them), or None."""
    k = bisect.bisect_left(points, sequence)
    return times[k] if k < len(points) else None


def lags(samples: list[tuple[float, float, int]], times: list[float], points: list[int]) -> tuple[list[float], int, int]:
    """Per sample: first checkpoint time covering its sequence minus its reply time; (lags, early, missing)."""
    out, early, missing = [], 0, 0
    for (_, replied, _), queryable in zip(samples, _queryable(samples, times, points)):
        if queryable is None:
            missing += 1
            continue
        lag = queryable - replied
        early += lag <= 0
        out.append(max(0.0, lag))
    return out, early, missing


def _queryable(samples: list[tuple[float, float, int]], times: list[float], points: list[int]) -> list[float | None]:
    """Per sample, when the first checkpoint covering its sequence arrived (None if never)."""
    return [covered_at(times, points, sequence) for _, _, sequence in samples]


async def wait_for_file(path: Path, predicate: Any, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if path.exists() and predicate(path):
            return True
        await asyncio.sleep(0.1)
    return False


async def lag_benchmark(servers: Servers, cfg: Config, log: Any) -> dict[str, Any]:
    """Try 5,000 creates/s, then lower rates if needed; lag of the highest sustained attempt."""
    out_path = servers.work_dir / "m2-checkpoints.log"
    attempts: list[dict[str, Any]] = []
    relayed: dict[int, float] = {}  # ledger_sequence -> when the relay's publish reached a core subscriber

    async def on_ledger(msg: Any) -> None:
        relayed.setdefault(int((msg.headers or {}).get("Pam-Ledger-Sequence", 0)), time.monotonic())

    async with pamledger_service(servers, "m2lag") as (nc, prefix, child, _db):
        await nc.subscribe(f"{prefix}.ledger.>", cb=on_ledger, pending_msgs_limit=1_000_000,
                           pending_bytes_limit=1 << 30)
        listener = python_child("m2-listen", "bench.projection_listen", {}, servers.work_dir,
                                child.env["PAMLEDGER_DATABASE_URL"], str(out_path))
        try:
            database_url = child.env["PAMLEDGER_DATABASE_URL"]
            listener.start()
            if not await wait_for_file(out_path, lambda p: "ready" in p.read_text(), 20):
                raise RuntimeError(f"checkpoint listener did not start:\n{listener.log_tail()}")
            rate: float = TARGET_RATE
            capacity: float | None = None
            for _ in range(MAX_ATTEMPTS):
                log(f"lag: open loop at {rate:.0f} creates/s for {cfg.warmup:g}+{cfg.duration:g} s")
                cpu0, t0 = child.cpu_seconds(), time.monotonic()
                attempt = await open_loop(nc, prefix, rate, cfg.warmup, cfg.duration)
                attempt["service_cpu_share"] = round((child.cpu_seconds() - cpu0) / (time.monotonic() - t0), 2)
                last = max((s[2] for s in attempt["samples"]), default=0)
                await wait_for_file(out_path, lambda p: read_checkpoints(p)[1][-1:] >= [last], 60)
                await asyncio.sleep(0.3)
                attempts.append(attempt)
                log(f"lag: {attempt['achieved_replies_per_second']} replies/s, sustained={attempt['sustained']}"
                    f" {attempt['stopped']}")
                if attempt["sustained"]:
                    break
                if capacity is None:
                    probe = await drive(nc, command_subject(prefix, "create"), "capacity", create_requests("m2cap"),
                                        check_result, 64, 0.5, 2.0)
                    capacity = probe.rate
                    log(f"lag: closed-loop capacity (64 in flight) {capacity:.0f} creates/s")
                    head = (await writer_status(nc, prefix))["ledger_sequence"]
                    await wait_for_file(out_path, lambda p: read_checkpoints(p)[1][-1:] >= [head], 60)
                    rate = max(100.0, 0.8 * capacity // 50 * 50)
                else:
                    rate = max(100.0, 0.7 * rate // 50 * 50)
            log("lag: EXPLAIN of one live projector batch (auto_explain, rolled back)")
            merge = await explain_projector_batch(database_url)
        finally:
            listener.stop()
    times, points = read_checkpoints(out_path)
    for attempt in attempts:
        samples = attempt.pop("samples")
        split = [(relayed[q] - r, t - relayed[q]) for (_, r, q), t in zip(samples, _queryable(samples, times, points))
                 if q in relayed and t is not None]
        attempt["reply_to_stream"] = Result("reply -> in stream", len(split), cfg.duration,
                                            [max(0.0, a) for a, _ in split], 1)
        attempt["stream_to_queryable"] = Result("in stream -> queryable", len(split), cfg.duration,
                                                [max(0.0, b) for _, b in split], 1)
        if samples:
            attempt["projector_commits"] = commit_stats(times, points, min(s[2] for s in samples),
                                                        max(s[2] for s in samples))
        found, early, missing = lags(samples, times, points)
        attempt["lag"] = Result(f"lag at {attempt['rate']:.0f}/s", len(found), cfg.duration, found, 1)
        attempt["create"] = Result(f"create at {attempt['rate']:.0f}/s (scheduled send -> reply)", len(samples),
                                   cfg.duration, [replied - scheduled for scheduled, replied, _ in samples], 1)
        attempt.update(queryable_before_reply=early, never_queryable=missing)
    good = [a for a in attempts if a["sustained"]]
    chosen = max(good, key=lambda a: a["rate"]) if good else attempts[-1]
    return {"attempts": attempts, "chosen": chosen, "target_rate": TARGET_RATE, "projector_batch": merge,
            "closed_loop_capacity": round(capacity, 1) if capacity else None,
            "notifications": len(times), "sustained_target": chosen["sustained"] and chosen["rate"] >= TARGET_RATE}
