"""One checkpointed follower of the ledger stream: a name and an apply step are all a follower adds.

Why in the kernel: the projector learned the hard way how to follow the stream (push delivery, gaps,
checkpoint in the same transaction as the rows, re-creation from the checkpoint, batching, bulk acks,
the stuck-event policy); the indexer and the grants projection follow it the same way, so that lives
here once and each follower brings only its `ApplyStep` and a `FollowerSpec` (names and lock key).

On start the follower reads its checkpoint from Postgres and (re)creates its durable consumer to start
right after it, so the consumer's position can never run ahead of what was committed. The server pushes
events to a private inbox; a callback (on the raw bytes: `infra.nats_raw`) only buffers them, and the
loop takes what is buffered (up to `batch`) as one batch: the step's rows, the checkpoint and a NOTIFY
commit in one pipelined transaction. A step that prepares (the indexer embeds) prepares the next buffered
batch while this one's transaction runs, on a connection of its own (`infra.prepare_ahead`). Acknowledgements are cumulative (AckPolicy.ALL) and sent in bulk
(every quarter of `max_ack_pending` events or `ack_every_seconds`, and when idle: `follower.*` settings).

Why push, not pull: nats-py's `fetch` costs about 5x more client CPU per message than a subscription
callback, and under load that CPU was most of the lag; raw deliveries skip nats-py's header parsing and
`Msg` objects, another 40% of the projector's CPU at 5,000 events/s. A gap in stream sequences is never
skipped: the follower applies what is contiguous and re-subscribes from its checkpoint.

An event it cannot apply never stops it silently and is never skipped: the batch falls back to one event
per transaction, so the checkpoint stops exactly before the bad event; the traceback and sequence are
logged once, status shows it stuck (`infra.stuck`), and it retries from the checkpoint (EventFailed: a
new connection and subscription) with capped backoff.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from datetime import datetime, timezone
from typing import Any, Protocol, cast

import nats
import psycopg
import structlog
from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy
from nats.js.errors import NotFoundError

from infra import locks, tracing
from infra.cleanup import run_to_end
from infra.ledger_identity import REBUILD_PROJECTION, follower_disagreement, wait_for_agreement
from infra.nats_raw import RawClient, stream_sequence
from infra.pg_pipeline import pipelined_transaction
from infra.prepare_ahead import Ahead, Connect, PreparingStep
from infra.projections import advance_checkpoint, checkpoint, notify_checkpoint, partition_channel, \
    partition_checkpoint
from pamledger_client.protocol.subjects import partition_wildcard
from infra.settings import FollowerSettings
from infra.stuck import StuckState, describe, traceback_text
from pamledger_client.protocol.tasks import reraise_if_cancelled

log = structlog.get_logger(__name__)

Event = tuple[int, bytes]  # (ledger sequence, the event's bytes as the stream carries them)


class ApplyStep(Protocol):
    """What a follower derives from the ledger: writes the rows of a batch of events, in order.

    Called inside the follower's transaction (pipelined: statements only, no COPY), after the checkpoint
    row is locked and before COMMIT, so rows and checkpoint commit together or not at all. It must be
    idempotent per event: after a crash the batch since the checkpoint arrives again."""

    async def apply(self, conn: psycopg.AsyncConnection[Any], events: list[Event]) -> None: ...


@dataclass(frozen=True)
class FollowerSpec:
    """A follower's names: its role (logs, status subject, durable consumer), its checkpoint row, the
    channel its commits NOTIFY (read-your-writes waiters listen there) and its advisory lock."""

    name: str
    checkpoint: str
    notify_channel: str
    lock_base: int
    step: Callable[[], ApplyStep | PreparingStep]  # a PreparingStep: see infra.prepare_ahead
    batch: int = 500  # events per transaction at most (the indexer takes fewer: each costs an embedding)
    # What an operator runs when this follower's checkpoint is another ledger's or ahead of it (its refusal
    # names it): the projection is rebuilt by replay; another follower brings its own rebuild.
    recovery: str = REBUILD_PROJECTION

    def durable(self, partition: int) -> str:
        return f"pamledger-{self.name}-p{partition}"

    def in_partition(self, partition: int) -> FollowerSpec:
        """The spec following `partition`: partition 0's checkpoint row and notify channel keep the names
        they had with one partition; another partition's carry it (partition_checkpoint, partition_channel),
        so each partition has its own position and its own read-your-writes wake-ups."""
        if partition == 0:
            return self
        return replace(self, checkpoint=partition_checkpoint(self.checkpoint, partition),
                       notify_channel=partition_channel(self.notify_channel, partition))

    def lock_key(self, partition: int) -> int:
        return locks.partition_key(self.lock_base, partition)


class StreamGap(Exception):
    """A pushed event skipped a stream sequence: re-subscribe from the checkpoint."""


class EventFailed(Exception):
    """The event at `sequence` could not be applied: the caller waits out the backoff, then retries it on a
    new connection from the checkpoint, so nothing the failure left in the session (such as psycopg's
    prepared-statement cache out of step with the server: `infra.pg_pipeline`) carries over."""

    def __init__(self, sequence: int):
        super().__init__(f"cannot apply ledger sequence {sequence}")
        self.sequence = sequence


class Follower:
    """Follows `{prefix}.ledger.p{partition}.>` and keeps the spec's rows and checkpoint in step.

    The stream holds one partition's ledger with stream sequence == ledger sequence (the relay enforces
    it), so every event after the checkpoint arrives with the next sequence; anything else is a gap.
    """

    def __init__(self, spec: FollowerSpec, nc: RawClient, conn: psycopg.AsyncConnection[Any], stream: str,
                 prefix: str, partition: int, settings: FollowerSettings, batch: int | None = None,
                 stuck: StuckState | None = None, connect: Connect | None = None):
        spec = spec.in_partition(partition)  # its own checkpoint row and notify channel
        self.spec = spec
        self.step = spec.step()
        self.nc = nc
        self.settings = settings
        # Acks only let the server push more (max_ack_pending): the position that counts is the checkpoint
        # in Postgres, from which the consumer is re-created on every start. So acknowledge in bulk.
        self.ack_every_events = max(1, settings.max_ack_pending // 4)
        self.stuck = stuck if stuck is not None else StuckState(0.5, 30.0)
        self.conn = conn
        # A preparing step prepares on a connection of its own, the next batch while this one's transaction
        # runs, when `connect` opens one (infra.prepare_ahead); else in place on `conn`, before it.
        self.ahead = Ahead(cast(PreparingStep, self.step), conn, connect) \
            if hasattr(self.step, "apply_prepared") else None
        self.stream = stream
        self.subject = partition_wildcard(prefix, partition)
        self.durable = spec.durable(partition)
        self.partition = partition
        self.batch = batch if batch is not None else spec.batch
        self.applied = 0
        self._buffer: list[tuple[bytes, bytes]] = []  # (reply subject, event) as delivered
        self._arrived = asyncio.Event()
        self._apply_started = 0.0
        self._unacked: bytes | None = None  # reply subject of the last event applied but not yet acknowledged
        self._acked_through = 0  # the stream sequence the last acknowledgement covered
        self._acked_at = 0.0
        self._traced: dict[int, bytes] = {}  # stream sequence -> header block with a traceparent (tracing on)

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
                log.warning(f"{self.spec.name}.resubscribing", error=type(exc).__name__, detail=str(exc),
                            applied=self.applied)
                await asyncio.sleep(0.5)
            finally:
                # To its end even under a role's repeated cancels (infra.cleanup): a subscription left behind
                # would go on pushing into a follower that stopped.
                await run_to_end(self._release(sub))

    async def _release(self, sub: Any) -> None:
        """Drop the batch being prepared ahead and the push subscription."""
        if self.ahead is not None:
            await self.ahead.discard()
        if sub is not None:
            try:
                await self.nc.unsubscribe_raw(sub)
            except nats.errors.Error:
                pass

    async def close(self) -> None:
        """Close what the follower opened itself (the prepare connection)."""
        if self.ahead is not None:
            await self.ahead.close()

    async def _subscribe(self) -> Any:
        js = self.nc.jetstream()
        await wait_for_agreement(self.spec.name, lambda: follower_disagreement(
            self.conn, js, self.stream, self.spec.checkpoint, self.partition, self.spec.recovery))
        self.applied = await checkpoint(self.conn, self.spec.checkpoint)
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
            f"{self.spec.name}.following", from_sequence=self.applied + 1, stream=self.stream)
        return sub

    def _on_delivery(self, subject: bytes, reply: bytes, data: bytes, headers: bytes | None) -> None:
        if not data and headers and headers.startswith(b"NATS/1.0 "):
            return  # a status message (we asked for neither heartbeats nor flow control)
        self._buffer.append((reply, data))
        self._arrived.set()
        if tracing.ENABLED and headers and b"traceparent" in headers:
            self._traced[stream_sequence(reply)] = headers

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
        # A batch prepared ahead is taken as it was prepared (the same deliveries, fewer than `batch` if
        # fewer were buffered then), so its preparation is used.
        take = self.ahead.span if self.ahead is not None and self.ahead.span else self.batch
        msgs, self._buffer = self._buffer[:take], self._buffer[take:]
        if not self._buffer:
            self._arrived.clear()
        self._apply_started = time.monotonic()
        taken, gap = contiguous([stream_sequence(reply) for reply, _ in msgs], self.applied)
        if taken:
            await self._apply([(seq, msgs[index][1]) for index, seq in taken])
        if gap is not None:  # what was contiguous is applied; the consumer is re-created after it
            raise StreamGap(f"expected stream sequence {self.applied + 1}, got {gap}")
        self._unacked = msgs[-1][0]
        due = time.monotonic() - self._acked_at >= self.settings.ack_every_seconds
        if due or self.applied - self._acked_through >= self.ack_every_events:
            await self._ack()

    async def _apply(self, events: list[Event]) -> None:
        """Apply events in one transaction; if that fails, one per transaction up to the one that fails,
        so the good events before a bad one are never held back. Raises EventFailed."""
        try:
            await self._apply_batch(events, ahead=True)
        except Exception as exc:  # noqa: BLE001 - any event-level failure: find the event, report it, retry
            if self.ahead is not None:
                await self.ahead.discard()  # prepared behind a batch that did not commit
            self._reraise_if_lost(exc)
            if len(events) == 1:
                raise self._failed(events[0][0], exc) from exc
            for event in events:
                try:
                    await self._apply_batch([event])
                except Exception as single:  # noqa: BLE001
                    self._reraise_if_lost(single)
                    raise self._failed(event[0], single) from single
        left = self.stuck.passed(self.applied)
        if left is not None:
            log.info(f"{self.spec.name}.recovered", ledger_sequence=left.sequence, attempts=left.attempts,
                     stuck_seconds=round((datetime.now(timezone.utc) - left.since).total_seconds(), 3))

    async def _apply_batch(self, events: list[Event], ahead: bool = False) -> None:
        """The step's rows, the checkpoint (locked first) and the NOTIFY: one transaction, one round trip.
        With `ahead`, a preparing step's next buffered batch prepares while this transaction runs."""
        through = events[-1][0]
        started_ns = time.time_ns() if tracing.ENABLED else 0
        prepared: Any = None
        if self.ahead is not None:
            prepared = await self.ahead.prepared_for(events)
            if ahead:
                self.ahead.start(*self._next_events(through), prepared)
        async with pipelined_transaction(self.conn):
            await advance_checkpoint(self.conn, self.spec.checkpoint, through, self.partition)
            if self.ahead is not None:
                await cast(PreparingStep, self.step).apply_prepared(self.conn, events, prepared)
            else:
                await cast(ApplyStep, self.step).apply(self.conn, events)
            await notify_checkpoint(self.conn, self.spec.notify_channel, through)  # sent at COMMIT
        self.applied = through
        if tracing.ENABLED and self._traced:
            self._trace_applied(events, started_ns)

    def _trace_applied(self, events: list[Event], started_ns: int) -> None:
        """An `{name}.apply` span per applied event whose message carried a traceparent (the relay's), timed
        as its batch's transaction; events read without one (none was sent) get none."""
        ended_ns = time.time_ns()
        attributes = {"pamledger.batch_size": len(events)}
        for sequence, _ in events:
            block = self._traced.pop(sequence, None)
            parent = tracing.parent_in_block(block)
            if parent is not None:
                tracing.record(f"{self.spec.name}.apply", parent, started_ns, ended_ns,
                               {**attributes, "pamledger.ledger_sequence": sequence})
        through = events[-1][0]
        for sequence in [s for s in self._traced if s <= through]:  # redeliveries of what is applied
            del self._traced[sequence]

    def _next_events(self, through: int) -> tuple[list[Event], int]:
        """The buffered events contiguous after `through` that the next batch will be (up to `batch`), and
        how many buffered deliveries they span."""
        msgs = self._buffer[:self.batch]
        taken, _ = contiguous([stream_sequence(reply) for reply, _ in msgs], through)
        if not taken:
            return [], 0
        return [(seq, msgs[index][1]) for index, seq in taken], taken[-1][0] + 1

    def _reraise_if_lost(self, exc: Exception) -> None:
        """A lost connection is not the event's fault: let the caller reconnect (follow_forever)."""
        reraise_if_cancelled()
        lost = self.conn.broken or self.conn.closed or (self.ahead is not None and self.ahead.lost())
        if isinstance(exc, psycopg.Error) and lost:
            raise exc

    def _failed(self, sequence: int, exc: Exception) -> EventFailed:
        """Count the failure; log the traceback only when the stuck state changes, not on every retry."""
        reason = describe(exc)
        if self.stuck.failed(sequence, reason, datetime.now(timezone.utc)):
            log.error(f"{self.spec.name}.event_failed", ledger_sequence=sequence, reason=reason,
                      exception=traceback_text(exc))
        else:
            log.debug(f"{self.spec.name}.retry_failed", ledger_sequence=sequence,
                      attempts=self.stuck.current.attempts if self.stuck.current else 0)
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
