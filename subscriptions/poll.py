"""One poll of a poll-mode subscription: read what follows its position, up to max_events or wait_ms.

Why apart from the gateway: requests and bookkeeping there, delivery here (as subscriptions.pump is for
push); a poll needs only its session and the gateway's way to close a subscription whose access ended.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from datetime import datetime, timezone
from typing import Any

import msgspec
import nats.errors
import nats.js.errors
import structlog

from infra.stuck import describe, traceback_text
from schemas.subscriptions import PollRequest
from subscriptions.session import AccessRevoked, Session

log = structlog.get_logger(__name__)
# What a poll answers service_unavailable for, without marking the subscription stuck (infra.request_shell)
UNAVAILABLE = (nats.js.errors.ServiceUnavailableError, nats.errors.TimeoutError, nats.errors.NoRespondersError,
               nats.errors.ConnectionClosedError)
Revoked = Callable[[Session, int], Awaitable[None]]  # the actor may no longer read this sequence


async def poll(session: Session, request: PollRequest, revoked: Revoked) -> dict[str, Any]:
    """The poll's answer. Call it holding `session.poll_lock` (polls of one subscription take turns). An
    event it cannot get past (a decode error, an authorizer bug) fails the poll, is shown stuck in the
    subscription's status, and is read again by the next poll: never skipped."""
    deadline = asyncio.get_running_loop().time() + request.wait_ms / 1000
    events: list[Any] = []
    # A resume while this poll waits (its client gave up on it: the answer was lost with a NATS node, say)
    # repositions the subscription under a new generation: from then on this poll moves nothing, or it would
    # acknowledge past the resume's position what its client never received.
    generation = session.generation
    while len(events) < request.max_events and not session.closing and session.generation == generation:
        remaining = deadline - asyncio.get_running_loop().time()
        try:
            batch, _ = await session.read(request.max_events - len(events), max(remaining, 0.05))
            if session.generation != generation:
                break
            for sequence, event, raw in batch:
                if session.admit(sequence, event):
                    events.append({"ledger_sequence": sequence, "event": msgspec.Raw(raw)})
                    session.last_delivered = sequence
        except AccessRevoked as at:
            await revoked(session, at.sequence)
            break
        except Exception as exc:
            if session.generation != generation:
                break  # the resume closed the reader under this poll: nothing failed
            if isinstance(exc, UNAVAILABLE):  # NATS or a JetStream leader away (a node died): no event's fault
                await session.close_reader()  # reopened by the next poll, from scanned + 1
                log.warning("subscription.poll_unavailable", subscription_id=session.id, error=type(exc).__name__)
                raise
            await _failed(session, exc)
            raise
        session.client_acked = session.scanned  # poll acknowledges what it returns
        session.stuck.passed(session.scanned)
        if events or remaining <= 0:
            break
    return {"subscription_id": session.id, "events": events, "last_delivered_sequence": session.last_delivered,
            "closed": session.closing}


async def _failed(session: Session, exc: Exception) -> None:
    """What the reader fetched is not fetched again: reopen it from `scanned + 1`; report once per change."""
    await session.close_reader()
    reason = describe(exc)
    if session.stuck.failed(session.trying, reason, datetime.now(timezone.utc)):
        log.error("subscription.delivery_failed", subscription_id=session.id, ledger_sequence=session.trying,
                  reason=reason, exception=traceback_text(exc))
