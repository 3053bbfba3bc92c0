"""The push loop of one subscription: catch up through its own reader, join the partition feed, drain
what it buffers, hold back at max_unacked per backpressure policy, and send keepalives when idle.

Why apart from the gateway: requests and bookkeeping there, delivery here; the pump only needs its
session, the feed, and the gateway's two ways to close a subscription.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable

import nats
import structlog

from infra.tasks import reraise_if_cancelled
from subscriptions.feed import PartitionFeed
from subscriptions.session import READ_BATCH, AccessRevoked, Session

log = structlog.get_logger(__name__)
CATCH_UP_WAIT_SECONDS = 0.1
Close = Callable[[Session, str], Awaitable[None]]  # close(session, reason)
Revoked = Callable[[Session, int], Awaitable[None]]  # the actor may no longer read this sequence


async def pump(session: Session, feed: PartitionFeed, close: Close, revoked: Revoked) -> None:
    """Push loop of one subscription: read until caught up, then drain what the feed buffers; wait for
    acks at max_unacked (per backpressure policy); keepalives when idle."""
    keepalive = (session.request.delivery.keepalive_interval_ms or 0) / 1000
    while not session.closing:
        try:
            if session.room() <= 0:
                await _backpressure(session, keepalive, close)
            elif not session.live:
                await _catch_up(session, feed)
                await _keepalive_if_idle(session, keepalive)
            elif session.buffer:
                await session.drain_buffer()
            else:
                await wait(session, keepalive or 30.0)
                await _keepalive_if_idle(session, keepalive)
        except AccessRevoked as revoked_at:
            await revoked(session, revoked_at.sequence)
            return
        except (nats.errors.Error, asyncio.TimeoutError) as exc:
            reraise_if_cancelled()
            log.warning("subscription.pump_retrying", subscription_id=session.id, error=type(exc).__name__)
            await session.close_reader()  # reopened from `scanned + 1`
            await asyncio.sleep(0.5)


async def _catch_up(session: Session, feed: PartitionFeed) -> None:
    epoch, feed_epoch = session.buffer_epoch, feed.covering()
    # Never fetch more than there is room for: what the reader hands over is not handed over again.
    events, caught_up = await session.read(min(session.room(), READ_BATCH), CATCH_UP_WAIT_SECONDS)
    for sequence, event, raw in events:
        await session.deliver(sequence, event, raw)
    if (caught_up and epoch == session.buffer_epoch and feed_epoch is not None
            and feed_epoch == feed.covering() and not session.closing):
        # Everything up to this fetch came from the reader; everything after is in the buffer (the
        # feed followed the stream throughout, and the buffer was not dropped).
        await session.close_reader()
        session.live = True
        await session.drain_buffer()


async def _backpressure(session: Session, keepalive: float, close: Close) -> None:
    delivery = session.request.delivery
    policy = delivery.backpressure_policy or "close_on_lag"
    if policy == "drop_oldest":
        session.drop_oldest()
    elif policy == "close_on_lag" and session.oldest_unacked_age() * 1000 > delivery.max_lag_ms:
        await close(session, "backpressure")
    else:
        await wait(session, 0.25)
        await _keepalive_if_idle(session, keepalive)


async def wait(session: Session, seconds: float) -> None:
    """Until the session is woken (an ack, an event, a reposition) or `seconds` pass."""
    session.wake.clear()
    # asyncio.timeout, not wait_for: on 3.11 wait_for swallows a cancellation that lands as the event
    # is set, and a pump that survives its cancel leaves `resume` waiting for it forever.
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(seconds):
            await session.wake.wait()


async def _keepalive_if_idle(session: Session, keepalive: float) -> None:
    if keepalive and not session.closing and time.monotonic() - session.last_sent_at >= keepalive:
        await session.notify("keepalive")
