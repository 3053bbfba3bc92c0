"""Closes on their way to durable: the `subscriptions` row marked 'closing', then subscription_closed in
the ledger, then the row marked 'closed'.

Why apart from the gateway: a close is acknowledged only once it is durable. The row marked 'closing' is
the point of no return (a later leader finishes the ledger entry and never resumes delivery); until it is
written the close is not done, so a close the database could not take is answered service_unavailable and
kept here as `unmarked`, for the flusher (after a reconnect) or a retried close to record.
"""

from __future__ import annotations

from typing import Any

import msgspec
import structlog

from infra.requester import CommandRequester
from schemas.errors import PamledgerError
from schemas.subscriptions import SubscribeRequest
from subscriptions.session import Session
from subscriptions.store import LOST_CONNECTION, SubscriptionStore

log = structlog.get_logger(__name__)


class Closes:
    """The closes one gateway has decided and not yet finished."""

    def __init__(self, store: SubscriptionStore, writer: CommandRequester):
        self.store = store
        self.writer = writer
        # The row says 'closing'; the ledger entry is not written yet: id -> (request, reason, last delivered).
        self.pending: dict[str, tuple[SubscribeRequest, str, int]] = {}
        # Delivery stopped, but the row could not be marked (database away): id -> session.
        self.unmarked: dict[str, Session] = {}

    async def mark(self, session: Session) -> bool:
        """Mark the row 'closing' (True); False when the database is away (kept in `unmarked`)."""
        try:
            await self.store.mark_closing(session.id, session.closing or "", session.last_delivered,
                                          session.client_acked)
        except LOST_CONNECTION as exc:
            if session.id not in self.unmarked:
                log.warning("subscription.close_unrecorded", subscription_id=session.id, error=type(exc).__name__)
            self.unmarked[session.id] = session
            return False
        self.unmarked.pop(session.id, None)
        self.pending[session.id] = (session.request, session.closing or "", session.last_delivered)
        return True

    async def finish(self, subscription_id: str) -> bool:
        """Write the subscription_closed ledger entry of a 'closing' subscription, then mark it closed
        (False: the writer is away, try again later). The entry carries one idempotency key per
        subscription, so finishing a close twice (a close racing the periodic retry, a retry after a crash,
        the next leader) writes it once and replays it after."""
        entry = self.pending.get(subscription_id)
        if entry is None:
            return True
        request, reason, last = entry
        try:
            await self.writer.command("close_subscription", {
                "scope_id": request.scope_id, "subscription_id": subscription_id,
                "actor": msgspec.to_builtins(request.actor), "reason": reason, "last_delivered_sequence": last,
                "idempotency_key": f"gateway:close:{subscription_id}"})
        except PamledgerError as exc:
            if exc.code == "service_unavailable":
                log.warning("subscription.close_pending", subscription_id=subscription_id, error=exc.message)
                return False
            # The writer refused the entry (a bug, not an outage): retrying cannot help; say so loudly.
            log.error("subscription.close_entry_refused", subscription_id=subscription_id, code=exc.code,
                      error=exc.message)
        await self.store.mark_closed(subscription_id)
        self.pending.pop(subscription_id, None)
        return True

    async def finish_pending(self) -> None:
        for subscription_id in list(self.pending):
            if not await self.finish(subscription_id):
                return  # the writer is still away: try again next round

    def ended_at(self, subscription_id: str) -> int | None:
        entry = self.pending.get(subscription_id)
        return entry[2] if entry is not None else None

    def report(self) -> dict[str, Any]:
        return {"closes_pending": len(self.pending), "closes_unrecorded": len(self.unmarked)}
