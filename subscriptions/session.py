"""One open subscription on the gateway: its position, its catch-up reader, its live buffer and pushes.

A push subscription is in one of two modes:

- **reading**: it reads the stream itself through a small ephemeral JetStream consumer of its own
  (filtered to its scope and event classes) from `scanned + 1`. That is catch-up after `open`, after a
  gateway takeover, after `resume`, and after its live buffer overflowed.
- **live**: the gateway's one partition feed (subscriptions.feed) hands it each new event of its scope;
  the event was decoded once for every subscription of that scope.

While reading, the feed's events for the scope are buffered. The session switches to live when a fetch
*issued after the buffer began* finds nothing more pending: every event up to then came through the
reader, every later one is in the buffer, so delivery has no gap and no reordering. A buffer that
overflows is dropped and the reader simply reads on.

Positions: `scanned` (every event up to it was delivered or filtered out), `last_delivered` (the last
event pushed), `client_acked` (the subscriber processed everything up to it). The gateway stores
`client_acked` in Postgres every `gateway.flush_seconds` (infra.settings); after a crash delivery resumes from there (at least once:
subscribers deduplicate by event_id / ledger_sequence).
"""

from __future__ import annotations

import asyncio
import hashlib
import time
import uuid
from collections import deque
from typing import Any

import msgspec
import nats
import nats.js.errors
import structlog
from nats.aio.client import Client as NATS
from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy

from infra import tracing
from infra.settings import GatewaySettings
from infra.stuck import StuckState
from pamledger_client.protocol.subjects import push_subject, scope_subject_base, scope_token
from pamledger_client.protocol.tasks import reraise_if_cancelled
from schemas.canonical import canonical_bytes
from schemas.event_views import event_as_json
from schemas.errors import InvalidRequest
from schemas.subscriptions import SubscribeRequest
from subscriptions.filters import Authorizer, matches

log = structlog.get_logger(__name__)

READ_BATCH = 256


class AccessRevoked(Exception):
    """The authorizer refused the actor an event: the subscription closes at `sequence`."""

    def __init__(self, sequence: int):
        super().__init__(sequence)
        self.sequence = sequence


def push_body(id_json: bytes, sequence: int, previous: int, generation: int, event: bytes) -> bytes:
    """A pushed event's canonical JSON, put together from its parts: with a thousand subscriptions this is
    the per-delivery hot path, and `event` is canonical already (equal to canonical_bytes of the dict,
    keys sorted: event, generation, ledger_sequence, previous_sequence, subscription_id, type)."""
    return b"".join((b'{"event":', event, b',"generation":', str(generation).encode(), b',"ledger_sequence":',
                     str(sequence).encode(), b',"previous_sequence":', str(previous).encode(),
                     b',"subscription_id":', id_json, b',"type":"event"}'))


def reader_prefix(subscription_id: str) -> str:
    return "pamsub_" + hashlib.sha256(subscription_id.encode()).hexdigest()[:24]


class Session:
    """Everything the gateway keeps about one open subscription."""

    def __init__(self, subscription_id: str, request: SubscribeRequest, position: int, nc: NATS,
                 stream: str, prefix: str, partition: int, authorizer: Authorizer, settings: GatewaySettings):
        self.id = subscription_id
        self.settings = settings
        self.request = request
        self.nc = nc
        self.js = nc.jetstream()
        self.stream = stream
        self.prefix = prefix
        self.partition = partition
        self.authorizer = authorizer
        self.scope_token = scope_token(request.scope_id)
        self.actor: dict[str, Any] = msgspec.to_builtins(request.actor)  # once, not per event
        self._id_json = msgspec.json.encode(subscription_id)
        self.deliver_subject = request.delivery.subject or push_subject(prefix, subscription_id)
        # The token the subscription is delivered under (the opener's, or the last resumer's); None: auth off.
        self.credential_id: str | None = None
        self.push_mode = request.delivery.mode == "push"
        self.max_unacked = request.delivery.max_unacked
        self.closing: str | None = None
        self.pump_task: asyncio.Task[None] | None = None
        self.wake = asyncio.Event()
        self.poll_lock = asyncio.Lock()  # polls of one subscription take turns (each runs in its own task)
        self.generation = 0  # bumped by every reposition; pushed messages carry it so stale ones are ignored
        self.buffer_epoch = 0  # bumped whenever the live buffer is dropped (overflow or reposition)
        self.stored_position = -1  # what Postgres holds; the gateway flushes when client_acked moves past it
        self.reader: Any = None
        self.reader_name: str | None = None
        self.stuck = StuckState(0.5, 30.0)  # delivery cannot get past an event (the gateway sets its settings)
        self.trying = position  # the event being read or checked now: where delivery is stuck if it fails
        self.reposition(position)

    # -- position -------------------------------------------------------------------------------

    def reposition(self, after_sequence: int) -> None:
        """Deliver everything after `after_sequence` next: back to reading, nothing in flight."""
        self.scanned = self.last_delivered = self.client_acked = self.previous = after_sequence
        self.unacked: deque[tuple[int, float]] = deque()  # pushed, not yet acknowledged: (sequence, at)
        # Live events waiting for room: (sequence, event, raw bytes, the trace context they came with or None).
        self.buffer: deque[tuple[int, dict[str, Any], bytes, Any]] = deque()
        self.live = False
        self.draining = False
        self.buffer_epoch += 1
        self.last_sent_at = time.monotonic()
        self.generation += 1
        self.wake.set()

    def fall_back(self) -> None:
        """Leave live mode: the buffer may lack events (or hold one that failed), so read on from `scanned`
        through this subscription's own reader. Nothing is skipped, nothing delivered twice."""
        self.live = False
        self.buffer.clear()
        self.buffer_epoch += 1
        self.wake.set()

    def room(self) -> int:
        return self.max_unacked - len(self.unacked)

    def oldest_unacked_age(self) -> float:
        return time.monotonic() - self.unacked[0][1] if self.unacked else 0.0

    # -- the live feed --------------------------------------------------------------------------

    async def offer(self, sequence: int, event: dict[str, Any], raw: bytes, parent: Any = None) -> None:
        """A new event of this scope from the partition feed (in stream order)."""
        if self.closing or sequence <= self.scanned:
            return
        if self.live and not self.buffer and not self.draining and self.room() > 0:
            await self.deliver(sequence, event, raw, parent)
            return
        if len(self.buffer) >= self.settings.live_buffer_events:
            # Too far behind to hold live events: drop them and read them from the stream later.
            self.buffer.clear()
            self.buffer_epoch += 1
            self.live = False
        else:
            self.buffer.append((sequence, event, raw, parent))
        self.wake.set()

    # -- delivery -------------------------------------------------------------------------------

    def admit(self, sequence: int, event: dict[str, Any]) -> bool:
        """The per-event checks, authorization first: True when the event is to be delivered. Either way
        the event counts as scanned. Raises AccessRevoked when the actor may no longer read it."""
        self.trying = sequence
        if not self.authorizer.allows(self.actor, self.request.scope_id, event):
            raise AccessRevoked(sequence)
        self.scanned = sequence
        return matches(self.request.filter, event)

    async def deliver(self, sequence: int, event: dict[str, Any], raw: bytes, parent: Any = None) -> bool:
        """Push one event if it passes `admit`. Raises AccessRevoked. `parent`: the trace context the live event
        came with (the relay's publish): with tracing on, the push is a `gateway.push` span under it and carries
        its `traceparent` to the subscriber. Catch-up pushes (read back from the stream) start no span."""
        if not self.admit(sequence, event):
            return False
        body = push_body(self._id_json, sequence, self.previous, self.generation, raw)
        self.previous = self.last_delivered = sequence
        self.unacked.append((sequence, time.monotonic()))
        self.last_sent_at = time.monotonic()
        if tracing.ENABLED and parent is not None:
            with tracing.span("gateway.push", parent, {"pamledger.ledger_sequence": sequence}) as span:
                await self.nc.publish(self.deliver_subject, body, headers=tracing.traceparent(span))
        else:
            await self.nc.publish(self.deliver_subject, body)
        return True

    async def drain_buffer(self) -> None:
        """Push buffered live events while there is room."""
        self.draining = True
        try:
            while self.buffer and self.room() > 0 and not self.closing:
                sequence, event, raw, parent = self.buffer.popleft()
                if sequence > self.scanned:
                    await self.deliver(sequence, event, raw, parent)
        finally:
            self.draining = False

    async def notify(self, kind: str, **fields: Any) -> None:
        body = canonical_bytes({"type": kind, "subscription_id": self.id, "generation": self.generation,
                                "last_delivered_sequence": self.last_delivered, **fields})
        self.last_sent_at = time.monotonic()
        await self.nc.publish(self.deliver_subject, body)

    # -- acknowledgements -----------------------------------------------------------------------

    def ack(self, sequence: int) -> None:
        """The subscriber processed everything up to `sequence` (cumulative)."""
        if sequence <= self.client_acked:
            return
        if not any(s == sequence for s, _ in self.unacked):
            raise InvalidRequest("ack for an event this subscription never delivered",
                                 details={"subscription_id": self.id, "ledger_sequence": sequence})
        while self.unacked and self.unacked[0][0] <= sequence:
            self.unacked.popleft()
        self.client_acked = sequence
        self.wake.set()

    def drop_oldest(self) -> None:
        """backpressure_policy drop_oldest: give up on the oldest unacknowledged delivery."""
        if self.unacked:
            self.client_acked = max(self.client_acked, self.unacked.popleft()[0])

    # -- the reader (catch-up and poll) ---------------------------------------------------------

    async def read(self, limit: int, timeout: float) -> tuple[list[tuple[int, dict[str, Any], bytes]], bool]:
        """Up to `limit` events after `scanned` from this subscription's own consumer, and whether the
        stream had nothing more pending for it when the fetch was answered."""
        if self.reader is None:
            await self._open_reader()
        try:
            msgs = await self.reader.fetch(max(limit, 1), timeout=timeout)
        except asyncio.TimeoutError:
            reraise_if_cancelled()
            return [], True
        out: list[tuple[int, dict[str, Any], bytes]] = []
        pending = 1
        for msg in msgs:
            meta = msg.metadata
            pending = meta.num_pending
            sequence = meta.sequence.stream
            if sequence > self.scanned and (not out or sequence > out[-1][0]):
                self.trying = sequence
                out.append((sequence, event_as_json(msg.data), msg.data))
        return out, pending == 0

    async def _open_reader(self) -> None:
        base = scope_subject_base(self.prefix, self.partition, self.request.scope_id)
        classes = self.request.filter.event_classes
        self.reader_name = f"{reader_prefix(self.id)}_{uuid.uuid4().hex[:8]}"
        config = ConsumerConfig(
            name=self.reader_name, ack_policy=AckPolicy.NONE, deliver_policy=DeliverPolicy.BY_START_SEQUENCE,
            opt_start_seq=self.scanned + 1, inactive_threshold=self.settings.reader_idle_seconds, mem_storage=True,
            filter_subjects=[f"{base}.{c}" for c in classes] if classes else [f"{base}.>"],
        )
        await self.js.add_consumer(self.stream, config)
        self.reader = await self.js.pull_subscribe_bind(self.reader_name, self.stream)

    async def close_reader(self) -> None:
        """Stop reading: unsubscribe and delete the consumer (best effort; JetStream expires it anyway)."""
        reader, name, self.reader, self.reader_name = self.reader, self.reader_name, None, None
        if reader is not None:
            try:
                await reader.unsubscribe()
            except nats.errors.Error:
                pass
        if name is not None:
            try:
                await self.js.delete_consumer(self.stream, name)
            except (nats.js.errors.NotFoundError, nats.errors.Error):
                pass
