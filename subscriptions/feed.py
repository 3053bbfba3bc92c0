"""The gateway's one live feed of a partition: every new ledger event, read once, handed to the live
subscriptions of its scope.

One ephemeral JetStream consumer (no acks) follows `{prefix}.ledger.p{partition}.>` from the stream's
tail. For each message the scope comes from the subject, so an event of a scope nobody subscribes to is
never decoded; otherwise it is decoded once and offered to each subscription of the scope in stream
order. When the consumer is lost (NATS restart, stream rebuilt) the feed recreates it from the last
sequence it handed out, so it never skips an event: subscriptions that were reading meanwhile find the
rest in their buffers.

With no push subscription for `gateway.feed_pause_after_seconds` (infra.settings) the feed deletes its consumer and reads nothing (an idle
gateway costs nothing per event). The next subscription wakes it at the stream's tail as a new `epoch`;
a subscription may switch to live only on a catch-up fetch issued while the current epoch was following
(subscriptions.pump), so the pause never opens a gap.

An event the feed cannot decode is never skipped and never crashes the gateway: the feed stays at it
(infra.stuck: logged once, retried with backoff, `stuck` in the gateway's status). A subscription whose
live delivery fails goes back to reading the stream itself (its pump reports it if it fails again).
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Callable
from datetime import datetime, timezone
from typing import Any

import nats
import nats.js.errors
import structlog
from nats.aio.client import Client as NATS
from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy

from infra import tracing
from infra.settings import GatewaySettings
from infra.stuck import StuckState, describe, traceback_text
from pamledger_client.protocol.subjects import partition_wildcard
from pamledger_client.protocol.tasks import reraise_if_cancelled
from schemas.event_views import event_as_json
from subscriptions.session import AccessRevoked, Session

log = structlog.get_logger(__name__)

BATCH = 512
IDLE_WAIT_SECONDS = 5.0  # a caught-up feed's lingering fetch; shorter when the feed pauses sooner
RETRY_SECONDS = 0.5


class Undecodable(Exception):
    """The feed cannot decode the event at its next position: it stays there (stuck) and retries."""


class PartitionFeed:
    """Follows the partition's stream subjects and dispatches to `Session.offer`."""

    def __init__(self, nc: NATS, stream: str, prefix: str, partition: int,
                 on_revoked: Callable[[Session, int], None], settings: GatewaySettings,
                 stuck: StuckState | None = None):
        self.nc = nc
        self.pause_after = settings.feed_pause_after_seconds
        self.idle_wait = min(IDLE_WAIT_SECONDS, self.pause_after)
        self.js = nc.jetstream()
        self.stream = stream
        self.subject = partition_wildcard(prefix, partition)
        self.on_revoked = on_revoked
        self.position = -1  # the last stream sequence handed out; -1 until the feed knows the tail
        self.by_scope: dict[str, set[Session]] = {}
        self.epoch = 0  # bumped each time the feed starts from the tail (at start and after a pause)
        self.following = asyncio.Event()  # set while this epoch's consumer delivers
        self.wanted = asyncio.Event()  # set while push subscriptions exist
        self.last_wanted = time.monotonic()
        self._deleting: set[asyncio.Future[None]] = set()
        self.stuck = stuck if stuck is not None else StuckState(0.5, 30.0)  # an event the feed cannot decode: never skipped, reported in the gateway's status

    def add(self, session: Session) -> None:
        self.by_scope.setdefault(session.scope_token, set()).add(session)
        self.wanted.set()

    def remove(self, session: Session) -> None:
        sessions = self.by_scope.get(session.scope_token)
        if sessions is not None:
            sessions.discard(session)
            if not sessions:
                del self.by_scope[session.scope_token]
        if not self.by_scope:
            self.wanted.clear()
            self.last_wanted = time.monotonic()

    def covering(self) -> int | None:
        """The epoch whose consumer is following now, else None: a catch-up fetch issued now proves a
        gap-free switch to live only if the same epoch is still current when it returns."""
        return self.epoch if self.following.is_set() else None

    async def run(self) -> None:
        """Follow the stream while subscriptions want it, recreating the consumer (from `position + 1`)
        whenever it fails; pause when none has wanted it for a while."""
        while True:
            await self.wanted.wait()
            name: str | None = None
            try:
                if self.position < 0:
                    self.position = (await self.js.stream_info(self.stream)).state.last_seq
                    self.epoch += 1
                name = f"pamfeed_{uuid.uuid4().hex[:12]}"
                await self.js.add_consumer(self.stream, ConsumerConfig(
                    name=name, ack_policy=AckPolicy.NONE, deliver_policy=DeliverPolicy.BY_START_SEQUENCE,
                    opt_start_seq=self.position + 1, filter_subject=self.subject, inactive_threshold=60.0,
                    mem_storage=True))
                pull = await self.js.pull_subscribe_bind(name, self.stream)
                self.following.set()
                # A retry of an event it cannot decode re-creates the consumer too: said once, not per retry.
                (log.debug if self.stuck.current else log.info)(
                    "feed.following", stream=self.stream, after_sequence=self.position, epoch=self.epoch)
                await self._follow(pull)
                # Paused: nobody subscribes. The next start is a new epoch at the tail.
                self.following.clear()
                self.position = -1
                log.info("feed.paused", stream=self.stream)
            except (nats.errors.Error, asyncio.TimeoutError) as exc:
                reraise_if_cancelled()
                log.warning("feed.retrying", error=type(exc).__name__, position=self.position)
                await asyncio.sleep(RETRY_SECONDS)
            except Undecodable:  # logged once per state change; read it again (from position + 1) later
                self.following.clear()
                await asyncio.sleep(self.stuck.delay())
            finally:
                if name is not None:  # not awaited: this may run during a cancel
                    deletion = asyncio.ensure_future(self._delete(name))
                    self._deleting.add(deletion)
                    deletion.add_done_callback(self._deleting.discard)

    async def _follow(self, pull: Any) -> None:
        """Dispatch until no subscription has wanted the feed for `pause_after` seconds."""
        busy = False
        while True:
            try:
                # Caught up: one lingering request answered the moment an event lands; behind: batches.
                msgs = await pull.fetch(BATCH if busy else 1, timeout=0.05 if busy else self.idle_wait)
            except asyncio.TimeoutError:
                reraise_if_cancelled()
                busy = False
                if self.stuck.current is not None:  # caught up without it: the stuck event is gone
                    self._passed(self.stuck.current.sequence)
                if self._unwanted():
                    return
                continue
            for msg in msgs:
                await self._dispatch(msg)
            # More waiting on the server: take a batch next; none: one lingering request for the next event
            # (a batch request when nothing is pending costs a second pull and a status message per event).
            busy = bool(msgs) and msgs[-1].metadata.num_pending > 0
            if not busy and self._unwanted():
                return

    def _unwanted(self) -> bool:
        """No push subscription for `pause_after` seconds: time to pause."""
        return not self.wanted.is_set() and time.monotonic() - self.last_wanted > self.pause_after

    async def _dispatch(self, msg: Any) -> None:
        sequence = msg.metadata.sequence.stream
        if sequence <= self.position:
            return
        sessions = self.by_scope.get(msg.subject.rsplit(".", 2)[1])
        if sessions:
            event = self._decode(sequence, msg.data)
            parent = tracing.parent_of(msg.headers) if tracing.ENABLED else None  # the relay's publish span
            for session in list(sessions):
                try:
                    await session.offer(sequence, event, msg.data, parent)
                except AccessRevoked as revoked:
                    self.remove(session)
                    self.on_revoked(session, revoked.sequence)
                except nats.errors.Error:
                    raise
                except Exception as exc:  # noqa: BLE001 - one subscription's trouble stops no other
                    # Its pump reads the event itself, and parks there (reported) if it fails again.
                    log.warning("subscription.live_delivery_failed", subscription_id=session.id,
                                ledger_sequence=sequence, reason=describe(exc))
                    session.fall_back()
        self.position = sequence
        self._passed(sequence)

    def _passed(self, sequence: int) -> None:
        left = self.stuck.passed(sequence)
        if left is not None:
            log.info("feed.recovered", ledger_sequence=left.sequence, attempts=left.attempts)

    def _decode(self, sequence: int, data: bytes) -> dict[str, Any]:
        try:
            return event_as_json(data)
        except Exception as exc:  # noqa: BLE001 - never crash the role, never skip: stuck, retried
            reason = describe(exc)
            if self.stuck.failed(sequence, reason, datetime.now(timezone.utc)):
                log.error("feed.event_failed", ledger_sequence=sequence, reason=reason, exception=traceback_text(exc))
            raise Undecodable(sequence) from exc

    async def _delete(self, name: str) -> None:
        try:
            await self.js.delete_consumer(self.stream, name)
        except (nats.js.errors.NotFoundError, nats.errors.Error):
            pass
