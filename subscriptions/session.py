"""One open subscription on the gateway: its durable consumer, delivery bookkeeping and pump.

Delivery position (what the subscriber acknowledged) lives in the subscription's durable JetStream
consumer (AckPolicy.ALL): the gateway acks a fetched message only once every event up to it that was
delivered has been acknowledged by the subscriber. Pushed messages name the previous pushed sequence, so
a subscriber that lost one (a core-NATS gap) notices and resumes from its last processed event.
"""

from __future__ import annotations

import asyncio
import hashlib
import time
from dataclasses import dataclass, field
from typing import Any

import msgspec
import nats
import structlog
from nats.aio.client import Client as NATS
from nats.aio.msg import Msg
from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy
from nats.js.errors import NotFoundError

from infra.subjects import scope_token
from infra.tasks import reraise_if_cancelled
from schemas.canonical import canonical_bytes
from schemas.errors import InvalidRequest
from schemas.subscriptions import SubscribeRequest
from subscriptions.filters import Authorizer, matches

log = structlog.get_logger(__name__)
_decoder = msgspec.json.Decoder(dict[str, Any])
ACK_WAIT_SECONDS = 600.0


def consumer_name(subscription_id: str) -> str:
    return "pamsub_" + hashlib.sha256(subscription_id.encode()).hexdigest()[:24]


@dataclass
class Entry:
    sequence: int
    msg: Msg
    pushed: bool
    at: float = field(default_factory=time.monotonic)


class Session:
    """Everything the gateway keeps about one open subscription."""

    def __init__(self, subscription_id: str, request: SubscribeRequest, start_sequence: int, nc: NATS,
                 stream: str, prefix: str, partition: int, authorizer: Authorizer):
        self.id = subscription_id
        self.request = request
        self.start_sequence = start_sequence
        self.nc = nc
        self.js = nc.jetstream()
        self.stream = stream
        self.prefix = prefix
        self.partition = partition
        self.authorizer = authorizer
        self.actor: dict[str, Any] = msgspec.to_builtins(request.actor)  # once, not per event
        self.deliver_subject = f"{prefix}.sub.deliver.{scope_token(subscription_id)}"
        self.entries: list[Entry] = []
        self.client_acked = start_sequence
        self.previous = start_sequence
        self.last_delivered = start_sequence
        self.closing: str | None = None
        self.pull: Any = None
        self.pump_task: asyncio.Task[None] | None = None
        self.generation = 0  # bumped by every attach; pushed messages carry it so stale ones are ignored

    # -- consumer ---------------------------------------------------------------------------------

    async def attach(self, after_sequence: int | None) -> None:
        """(Re)create the durable consumer to deliver everything after `after_sequence` (default: the
        acknowledged floor), dropping in-flight bookkeeping."""
        name = consumer_name(self.id)
        if after_sequence is None:
            after_sequence = self.start_sequence
            try:
                info = await self.js.consumer_info(self.stream, name)
                after_sequence = max(after_sequence, int(info.ack_floor.stream_seq))
            except NotFoundError:
                pass
        try:
            await self.js.delete_consumer(self.stream, name)
        except NotFoundError:
            pass
        base = f"{self.prefix}.ledger.p{self.partition}.{scope_token(self.request.scope_id)}"
        classes = self.request.filter.event_classes
        config = ConsumerConfig(
            durable_name=name, ack_policy=AckPolicy.ALL, deliver_policy=DeliverPolicy.BY_START_SEQUENCE,
            opt_start_seq=after_sequence + 1, ack_wait=ACK_WAIT_SECONDS, max_ack_pending=-1,
            filter_subjects=[f"{base}.{c}" for c in classes] if classes else [f"{base}.>"],
        )
        await self.js.add_consumer(self.stream, config)
        self.pull = await self.js.pull_subscribe_bind(name, self.stream)
        self.entries.clear()
        self.client_acked = self.previous = self.last_delivered = after_sequence
        self.generation += 1

    async def detach(self) -> None:
        if self.pull is not None:
            try:
                await self.pull.unsubscribe()
            except nats.errors.Error:
                pass
            self.pull = None

    async def delete_consumer(self) -> None:
        try:
            await self.js.delete_consumer(self.stream, consumer_name(self.id))
        except (NotFoundError, nats.errors.Error):
            pass

    # -- fetching and checking ------------------------------------------------------------------

    async def fetch(self, limit: int, timeout: float) -> list[tuple[int, dict[str, Any] | None, bytes]]:
        """Fetch, check and track up to `limit` events: (sequence, event or None if filtered out, bytes).
        Raises PermissionError when the actor may no longer read an event."""
        try:
            msgs = await self.pull.fetch(limit, timeout=timeout)
        except asyncio.TimeoutError:
            reraise_if_cancelled()
            return []
        out: list[tuple[int, dict[str, Any] | None, bytes]] = []
        seen = self.entries[-1].sequence if self.entries else self.client_acked
        for msg in msgs:
            sequence = msg.metadata.sequence.stream
            if sequence <= seen:
                continue  # a redelivery of something already tracked
            event = _decoder.decode(msg.data)
            if not self.authorizer.allows(self.actor, self.request.scope_id, event):
                raise PermissionError(sequence)
            wanted = matches(self.request.filter, event)
            self.entries.append(Entry(sequence, msg, wanted))
            out.append((sequence, event if wanted else None, msg.data))
            seen = sequence
        return out

    def unacked(self) -> int:
        return sum(1 for e in self.entries if e.pushed and e.sequence > self.client_acked)

    def oldest_unacked_age(self) -> float:
        for entry in self.entries:
            if entry.pushed and entry.sequence > self.client_acked:
                return time.monotonic() - entry.at
        return 0.0

    # -- acknowledgements -----------------------------------------------------------------------

    async def ack(self, sequence: int) -> None:
        """The subscriber processed everything up to `sequence` (cumulative)."""
        if sequence > self.client_acked:
            if not any(e.pushed and e.sequence == sequence for e in self.entries):
                raise InvalidRequest("ack for an event this subscription never delivered",
                                     details={"subscription_id": self.id, "ledger_sequence": sequence})
            self.client_acked = sequence
        await self.settle()

    async def settle(self) -> None:
        """Ack to JetStream through the last entry that needs nothing more from the subscriber."""
        upto = -1
        for index, entry in enumerate(self.entries):
            if entry.pushed and entry.sequence > self.client_acked:
                break
            upto = index
        if upto >= 0:
            await self.entries[upto].msg.ack()
            del self.entries[: upto + 1]

    async def drop_oldest(self) -> None:
        """backpressure_policy drop_oldest: give up on the oldest unacknowledged delivery."""
        for entry in self.entries:
            if entry.pushed and entry.sequence > self.client_acked:
                self.client_acked = entry.sequence
                break
        await self.settle()

    # -- push -----------------------------------------------------------------------------------

    async def push(self, sequence: int, raw: bytes) -> None:
        body = canonical_bytes({"type": "event", "subscription_id": self.id, "ledger_sequence": sequence,
                                "previous_sequence": self.previous, "generation": self.generation,
                                "event": msgspec.Raw(raw)})
        await self.nc.publish(self.deliver_subject, body, headers={"Pam-Ledger-Sequence": str(sequence)})
        self.previous = self.last_delivered = sequence

    async def notify(self, kind: str, **fields: Any) -> None:
        body = canonical_bytes({"type": kind, "subscription_id": self.id, "generation": self.generation,
                                "last_delivered_sequence": self.last_delivered, **fields})
        await self.nc.publish(self.deliver_subject, body)
