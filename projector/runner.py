"""The live projector: a durable JetStream push consumer applying ledger events to current_objects.

One projector per partition leads (Postgres advisory lock); others wait. On start it reads its
checkpoint from Postgres and (re)creates its durable consumer to start right after it, so the consumer's
position can never run ahead of what was committed. The server pushes events to a private inbox; a
callback (on the raw bytes: `infra.nats_raw`) only buffers them, and the apply loop takes what is
buffered (up to `batch`) as one batch: rows and checkpoint commit in one transaction. Acknowledgements
are cumulative (AckPolicy.ALL) and sent in bulk (every quarter of `max_ack_pending` events or
`ack_every_seconds`, and when idle: `follower.*` in infra.settings).

Why push, not pull: nats-py's `fetch` costs about 5x more client CPU per message than a subscription
callback (it awaits each message with its own timeout), and under load that CPU was most of the lag.
The deliveries skip nats-py's header parsing and `Msg` objects (`infra.nats_raw.RawClient`), another 40%
of the projector's CPU at 5,000 events/s. `max_ack_pending` bounds how far the server runs ahead of the
acknowledged batches; nothing is queued on the client beyond the buffer, and a gap in stream sequences
(a message lost on the client) is never skipped: the projector applies what is contiguous and
re-subscribes from its checkpoint.

An event it cannot apply (a database error, an undecodable event) never stops it silently and is never
skipped: the batch falls back to one event per transaction, so the checkpoint stops exactly before the bad
event; the traceback and sequence are logged once, status shows it stuck (`infra.stuck`), and it
retries from the checkpoint (EventFailed: a new connection and subscription) with capped backoff.
"""

from __future__ import annotations

import asyncio
import time
from datetime import datetime, timezone
from typing import Any

import nats
import psycopg
import structlog
from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy
from nats.js.errors import NotFoundError

from infra.ledger_identity import projector_disagreement, wait_for_agreement
from infra.nats_raw import RawClient, stream_sequence
from infra.settings import FollowerSettings
from infra.stuck import StuckState, describe, traceback_text
from infra.projections import PROJECTION, checkpoint
from infra.tasks import reraise_if_cancelled
from projector.rows import Row, current_row, fold
from projector.store import apply_rows

log = structlog.get_logger(__name__)
_PROJECTOR_LOCK_BASE = 0x70616D70_00  # 'pamp' + partition


def projector_lock_key(partition: int) -> int:
    return _PROJECTOR_LOCK_BASE + partition


class StreamGap(Exception):
    """A pushed event skipped a stream sequence: re-subscribe from the checkpoint."""


class EventFailed(Exception):
    """The event at `sequence` could not be applied: the caller waits out the backoff, then retries it on a
    new connection from the checkpoint, so nothing the failure left in the session (such as psycopg's
    prepared-statement cache out of step with the server: `infra.pg_pipeline`) carries over."""

    def __init__(self, sequence: int):
        super().__init__(f"cannot apply ledger sequence {sequence}")
        self.sequence = sequence


class Projector:
    """Follows `{prefix}.ledger.p{partition}.>` and keeps current_objects in step.

    The stream holds one partition's ledger with stream sequence == ledger sequence (the relay enforces
    it), so every event after the checkpoint arrives with the next sequence; anything else is a gap.
    """

    def __init__(self, nc: RawClient, conn: psycopg.AsyncConnection[Any], stream: str, prefix: str, partition: int,
                 settings: FollowerSettings, batch: int = 500, stuck: StuckState | None = None):
        self.nc = nc
        self.settings = settings
        # Acks only let the server push more (max_ack_pending): the position that counts is the checkpoint
        # in Postgres, from which the consumer is re-created on every start. So acknowledge in bulk, not per
        # batch: each ack is work for nats-server and a wake-up on a machine the writer shares.
        self.ack_every_events = max(1, settings.max_ack_pending // 4)
        self.stuck = stuck if stuck is not None else StuckState(0.5, 30.0)
        self.conn = conn
        self.stream = stream
        self.subject = f"{prefix}.ledger.p{partition}.>"
        self.durable = f"pamledger-projector-p{partition}"
        self.partition = partition
        self.batch = batch
        self.applied = 0
        self._buffer: list[tuple[bytes, bytes]] = []  # (reply subject, event) as delivered
        self._arrived = asyncio.Event()
        self._apply_started = 0.0
        self._unacked: bytes | None = None  # reply subject of the last event applied but not yet acknowledged
        self._acked_through = 0  # the stream sequence the last acknowledgement covered
        self._acked_at = 0.0

    async def run(self) -> None:
        """Apply batches forever; re-subscribes when the stream or consumer is lost or a gap shows."""
        while True:
            sub = None
            try:
                sub = await self._subscribe()
                while True:
                    await self._step()
            except (NotFoundError, StreamGap, nats.errors.Error) as exc:
                reraise_if_cancelled()
                log.warning("projector.resubscribing", error=type(exc).__name__, detail=str(exc),
                            applied=self.applied)
                await asyncio.sleep(0.5)
            finally:
                if sub is not None:
                    try:
                        await self.nc.unsubscribe_raw(sub)
                    except nats.errors.Error:
                        pass

    async def _subscribe(self) -> Any:
        js = self.nc.jetstream()
        await wait_for_agreement("projector", lambda: projector_disagreement(
            self.conn, js, self.stream, PROJECTION, self.partition))
        self.applied = await checkpoint(self.conn)
        self._buffer = []
        self._arrived.clear()
        self._unacked, self._acked_through = None, self.applied
        await js.stream_info(self.stream)  # raises NotFoundError until the relay created it
        try:
            await js.delete_consumer(self.stream, self.durable)
        except NotFoundError:
            pass
        inbox = self.nc.new_inbox()
        # Subscribe before the consumer exists, so nothing is pushed to an inbox nobody reads.
        sub = await self.nc.subscribe_raw(inbox, self._on_delivery)
        config = ConsumerConfig(
            durable_name=self.durable, deliver_subject=inbox, ack_policy=AckPolicy.ALL,
            deliver_policy=DeliverPolicy.BY_START_SEQUENCE, opt_start_seq=self.applied + 1,
            filter_subject=self.subject, max_ack_pending=self.settings.max_ack_pending, ack_wait=60,
        )
        await js.add_consumer(self.stream, config)
        # A retry of a stuck event re-subscribes too: say so once, when the state changes, not per retry.
        (log.debug if self.stuck.current else log.info)(
            "projector.following", from_sequence=self.applied + 1, stream=self.stream)
        return sub

    def _on_delivery(self, subject: bytes, reply: bytes, data: bytes, headers: bytes | None) -> None:
        if not data and headers and headers.startswith(b"NATS/1.0 "):
            return  # a status message (we asked for neither heartbeats nor flow control)
        self._buffer.append((reply, data))
        self._arrived.set()

    async def _step(self) -> None:
        if not self._buffer:
            try:
                await asyncio.wait_for(self._arrived.wait(), self.settings.idle_check_seconds)
            except asyncio.TimeoutError:
                reraise_if_cancelled()
                await self._ack()
                # Quiet: make sure there is still a consumer to push to us (the stream may have been lost
                # and rebuilt by the relay). NotFoundError re-subscribes from the checkpoint.
                await self.nc.jetstream().consumer_info(self.stream, self.durable)
                return
        # A short linger lets events gather into fewer, larger transactions under load: it bounds the
        # commit rate at 1/linger. It counts from the previous apply's start, so an apply that took
        # longer than the linger is followed at once.
        wait = self._apply_started + self.settings.linger_seconds - time.monotonic()
        if wait > 0:
            await asyncio.sleep(wait)
        msgs, self._buffer = self._buffer[:self.batch], self._buffer[self.batch:]
        if not self._buffer:
            self._arrived.clear()
        self._apply_started = time.monotonic()
        taken, gap = contiguous([stream_sequence(reply) for reply, _ in msgs], self.applied)
        if taken:
            await self._apply([(msgs[index][1], seq) for index, seq in taken])
        if gap is not None:  # what was contiguous is applied; the consumer is re-created after it
            raise StreamGap(f"expected stream sequence {self.applied + 1}, got {gap}")
        self._unacked = msgs[-1][0]
        due = time.monotonic() - self._acked_at >= self.settings.ack_every_seconds
        if due or self.applied - self._acked_through >= self.ack_every_events:
            await self._ack()

    async def _apply(self, events: list[tuple[bytes, int]]) -> None:
        """Apply (event, sequence) pairs in one transaction; if that fails, one per transaction up to the
        one that fails, so the good events before a bad one are never held back. Raises EventFailed."""
        try:
            await self._apply_batch(events)
        except Exception as exc:  # noqa: BLE001 - any event-level failure: find the event, report it, retry
            self._reraise_if_lost(exc)
            if len(events) == 1:
                raise self._failed(events[0][1], exc) from exc
            for event in events:
                try:
                    await self._apply_batch([event])
                except Exception as single:  # noqa: BLE001
                    self._reraise_if_lost(single)
                    raise self._failed(event[1], single) from single
        left = self.stuck.passed(self.applied)
        if left is not None:
            log.info("projector.recovered", ledger_sequence=left.sequence, attempts=left.attempts,
                     stuck_seconds=round((datetime.now(timezone.utc) - left.since).total_seconds(), 3))

    async def _apply_batch(self, events: list[tuple[bytes, int]]) -> None:
        rows: dict[tuple[str, str], Row] = {}
        for event, seq in events:
            fold(rows, current_row(event, seq))
        await apply_rows(self.conn, list(rows.values()), events[-1][1])
        self.applied = events[-1][1]

    def _reraise_if_lost(self, exc: Exception) -> None:
        """A lost connection is not the event's fault: let the caller reconnect (project_forever)."""
        reraise_if_cancelled()
        if isinstance(exc, psycopg.Error) and (self.conn.broken or self.conn.closed):
            raise exc

    def _failed(self, sequence: int, exc: Exception) -> EventFailed:
        """Count the failure; log the traceback only when the stuck state changes, not on every retry."""
        reason = describe(exc)
        if self.stuck.failed(sequence, reason, datetime.now(timezone.utc)):
            log.error("projector.event_failed", ledger_sequence=sequence, reason=reason, exception=traceback_text(exc))
        else:
            log.debug("projector.retry_failed", ledger_sequence=sequence, attempts=self.stuck.current.attempts
                      if self.stuck.current else 0)
        return EventFailed(sequence)

    async def _ack(self) -> None:
        """Acknowledge everything applied so far (AckPolicy.ALL: the last message covers the rest)."""
        if self._unacked is not None:
            await self.nc.publish(self._unacked.decode(), b"+ACK")
        self._unacked, self._acked_through, self._acked_at = None, self.applied, time.monotonic()


def contiguous(sequences: list[int], applied: int) -> tuple[list[tuple[int, int]], int | None]:
    """(index, sequence) of the events to apply after checkpoint `applied`, in order, and the first
    sequence that skips ahead (None when there is no gap). Sequences at or below what is already applied
    (redeliveries, duplicates) are left out; nothing after a gap is taken."""
    taken: list[tuple[int, int]] = []
    through = applied
    for index, seq in enumerate(sequences):
        if seq <= through:
            continue
        if seq != through + 1:
            return taken, seq
        taken.append((index, seq))
        through = seq
    return taken, None
