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
from datetime import datetime, timezone

import nats
import structlog

from infra.stuck import describe, traceback_text
from pamledger_client.protocol.tasks import reraise_if_cancelled
from subscriptions.feed import PartitionFeed
from subscriptions.session import READ_BATCH, AccessRevoked, Session

log = structlog.get_logger(__name__)
CATCH_UP_WAIT_SECONDS = 0.1
Close = Callable[[Session, str], Awaitable[bool]]  # close(session, reason)
Revoked = Callable[[Session, int], Awaitable[None]]  # the actor may no longer read this sequence


async def pump(session: Session, feed: PartitionFeed, close: Close, revoked: Revoked) -> None:
    """Push loop of one subscription: read until caught up, then drain what the feed buffers; wait for
    acks at max_unacked (per backpressure policy); keepalives when idle. An event it cannot get past
    (a decode error, an authorizer bug) parks it: logged once, shown stuck in status, retried with
    backoff, never skipped. A pump that is no longer its session's (a close undone) ends."""
    keepalive = (session.request.delivery.keepalive_interval_ms or 0) / 1000
    while not session.closing and session.pump_task is asyncio.current_task():
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
        except Exception as exc:  # noqa: BLE001 - never end silently: park, report, retry
            await _park(session, exc)
        else:
            _recovered(session)


async def _park(session: Session, exc: Exception) -> None:
    """Delivery cannot get past `session.trying`: say so once per change, then read it again after backoff."""
    reason = describe(exc)
    if session.stuck.failed(session.trying, reason, datetime.now(timezone.utc)):
        log.error("subscription.delivery_failed", subscription_id=session.id, ledger_sequence=session.trying,
                  reason=reason, exception=traceback_text(exc))
    session.fall_back()
    await session.close_reader()  # reopened from `scanned + 1`: the failed event is read again
    await asyncio.sleep(session.stuck.delay())


def _recovered(session: Session) -> None:
    left = session.stuck.passed(session.scanned)
    if left is not None:
        log.info("subscription.delivery_recovered", subscription_id=session.id, ledger_sequence=left.sequence,
                 attempts=left.attempts)


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
