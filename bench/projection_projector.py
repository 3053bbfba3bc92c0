"""Projection lag of the projector alone at the target rate, with the writer's work done beforehand.

On these 2-core machines the whole service cannot take 5,000 creates/s (bench.projection_lag measures its
capacity and the lag at what it sustains), so that step cannot tell whether the projector could. This
step answers that part alone: the ledger rows of `rate x (warmup + duration)` creates are committed in
bulk first (bench.ledger_loader, creates only), then the real relay (`command_handler.relay.Relay.follow`,
in this process) is handed them on a fixed schedule, as the writer hands it each committed batch, every
TICK seconds; the real projector (`pamledger run --roles projector`, its own processes) follows the
stream into `current_objects`. A row's "commit" time is its scheduled time.

Per event of the measured window: in stream = when the relay's acknowledged publish covering it
returned; queryable = the first checkpoint NOTIFY covering it (bench.projection_listen, its own process). The
writer's CPU and Postgres work are absent, so this is the projector's (and relay's) capability at the
rate, not the service's: the same machine gives the projector both cores here.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import psycopg
from nats.aio.client import Client as NATS

from bench.ledger_loader import LoadSpec, load_ledger
from bench.load import Result
from bench.procs import python_child
from bench.projection_explain import commit_stats
from bench.projection_lag import TARGET_RATE, covered_at, read_checkpoints, wait_for_file
from bench.scenarios import Config, other_cpu
from bench.servers import Servers
from bench.service import service_process
from command_handler.relay import Relay, ensure_stream
from infra.ledger import LedgerRow

TICK = 0.002  # how often the pacer hands the relay what is due (the writer commits a batch every few ms)
# A pacer this far behind its schedule stops: the run would not be at the rate. Less is only counted: a row
# handed over late is still timed from its scheduled commit, so the delay shows in the relay's share.
MAX_BEHIND = 1.0


class TimedRelay(Relay):
    """The real relay, noting when each acknowledged run of rows was in the stream."""

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        self.acked_through: list[int] = []  # last ledger_sequence of each acknowledged run, in order
        self.acked_at: list[float] = []  # when its acknowledgement arrived (time.monotonic())

    async def _publish(self, rows: list[LedgerRow]) -> None:
        await super()._publish(rows)
        self.acked_through.append(rows[-1].ledger_sequence)
        self.acked_at.append(time.monotonic())


async def _all_rows(relay: Relay, database_url: str) -> list[LedgerRow]:
    rows: list[LedgerRow] = []
    async with await psycopg.AsyncConnection.connect(database_url) as conn:
        while chunk := await relay.read_ledger(conn, rows[-1].ledger_sequence if rows else 0):
            rows += chunk
    return rows


async def _pace(relay: Relay, rows: list[LedgerRow], rate: float) -> tuple[float, float, str, int]:
    """Submit rows[i] at t0 + i / rate (in runs, every TICK); returns (t0, max delay s, why it stopped,
    rows submitted)."""
    t0 = time.monotonic() + 0.05
    i, behind = 0, 0.0
    while i < len(rows):
        now = time.monotonic()
        due = min(len(rows), int((now - t0) * rate) + 1) if now >= t0 else 0
        if due > i:
            behind = max(behind, now - (t0 + i / rate))
            if behind > MAX_BEHIND:
                return t0, behind, f"pacer {behind * 1e3:.0f} ms behind schedule", i
            relay.submit(rows[i:due])
            i = due
        await asyncio.sleep(TICK)
    return t0, behind, "", i


async def projector_lag(servers: Servers, cfg: Config, log: Any) -> dict[str, Any]:
    """At 5,000/s; if the projection falls behind, once more at 80% of the rate it drained at (a fresh
    database and projector), so the step also says what the projector sustains on this machine."""
    attempts = [await _attempt(servers, cfg, log, TARGET_RATE)]
    if not attempts[0]["sustained"]:
        rate = max(100.0, 0.8 * attempts[0]["drain_events_per_second"] // 50 * 50)
        attempts.append(await _attempt(servers, cfg, log, rate))
    return {"target_rate": TARGET_RATE, "attempts": attempts}


async def _attempt(servers: Servers, cfg: Config, log: Any, rate: float) -> dict[str, Any]:
    """The relay paced at `rate` over pre-committed creates; commit -> in stream -> queryable per event."""
    total = int(rate * (cfg.warmup + cfg.duration))
    db_name, url = servers.fresh_database("m2proj", migrated=False)
    try:
        log(f"projector: loading {total:,} creates (committed in bulk) for {rate:,.0f}/s ...")
        load = load_ledger(url, LoadSpec(events=total, update_share=0.0, transition_share=0.0))
        out_path = servers.work_dir / "m2-projector-checkpoints.log"

        async def empty_stream(nc: NATS, prefix: str, stream: str) -> None:
            await ensure_stream(nc.jetstream(), stream, prefix)

        async with service_process(servers, url, "m2proj", prepare=empty_stream, answering=("projector",),
                                   roles="projector") as (nc, prefix, stream, child):
            relay = TimedRelay(nc, url, stream, prefix, 0)
            rows = await _all_rows(relay, url)
            listener = python_child("m2-projector-listen", "bench.projection_listen", {}, servers.work_dir, url,
                                    str(out_path))
            follow = asyncio.create_task(relay.follow())
            try:
                listener.start()
                if not await wait_for_file(out_path, lambda p: "ready" in p.read_text(), 20):
                    raise RuntimeError(f"checkpoint listener did not start:\n{listener.log_tail()}")
                log(f"projector: relay paced at {rate:,.0f} events/s for {cfg.warmup:g}+{cfg.duration:g} s")
                cpu0 = _cpu(servers, child)
                t0, behind, stopped, submitted = await _pace(relay, rows, rate)
                sent_end = time.monotonic()
                reached = await wait_for_file(out_path, lambda p: read_checkpoints(p)[1][-1:] >= [submitted], 120)
                caught_up = time.monotonic() - sent_end
                if follow.done():  # the relay stopped: say why rather than report a stalled projection
                    follow.result()
                cpu1 = _cpu(servers, child)
            finally:
                follow.cancel()
                listener.stop()
    finally:
        servers.drop_database(db_name)
    times, points = read_checkpoints(out_path)
    window = (int(cfg.warmup * rate) + 1, submitted)
    lag, relay_part, projector_part = [], [], []
    for sequence in range(window[0], window[1] + 1):
        committed = t0 + (sequence - 1) / rate
        in_stream = covered_at(relay.acked_at, relay.acked_through, sequence)
        queryable = covered_at(times, points, sequence)
        if in_stream is None or queryable is None:
            continue
        lag.append(max(0.0, queryable - committed))
        relay_part.append(max(0.0, in_stream - committed))
        projector_part.append(max(0.0, queryable - in_stream))
    events = window[1] - window[0] + 1
    drained = [(t, p) for t, p in zip(times, points) if t >= t0]
    drain = (drained[-1][1] - drained[0][1]) / (drained[-1][0] - drained[0][0]) if len(drained) > 1 else 0.0
    log(f"projector: at {rate:,.0f}/s caught up {caught_up:.1f} s after the last commit; applied {drain:,.0f} events/s")
    return {
        "rate": rate, "events": len(rows), "load": load, "stopped": stopped, "max_pacer_delay_ms": round(behind * 1e3, 1),
        "caught_up": reached, "caught_up_after_last_commit_ms": round(caught_up * 1e3, 1),
        # sustained: the projection was never more than a second behind at the end (it kept the pace)
        "sustained": reached and not stopped and len(lag) == events and caught_up <= 1.0,
        "drain_events_per_second": round(drain),
        "lag": Result(f"commit -> queryable at {rate:,.0f}/s", len(lag), cfg.duration, lag, 1),
        "relay": Result("commit -> in stream (relay)", len(relay_part), cfg.duration, relay_part, 1),
        "projector": Result("in stream -> queryable (projector)", len(projector_part), cfg.duration, projector_part, 1),
        "commits": commit_stats(times, points, window[0], window[1]),
        "cpu_us_per_event": {k: round((cpu1[k] - cpu0[k]) / max(submitted, 1) * 1e6) for k in cpu0},
    }


def _cpu(servers: Servers, child: Any) -> dict[str, float]:
    """CPU seconds so far: the projector's processes, the servers, and this process ("bench driver": the
    pacer and the relay)."""
    return {"projector": child.cpu_seconds(), **other_cpu(servers)}
