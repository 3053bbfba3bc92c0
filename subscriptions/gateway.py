"""The Subscribe gateway: open, deliver (push or poll), ack, resume and close subscriptions.

It leads per partition (advisory lock, like the writer and projector); a standby takes over every open
subscription from the table and the durable consumers when the leader dies. Subjects (queue group
`pamledger-subscriptions`): {prefix}.sub.open | ack | poll | resume | close; pushed events go to
{prefix}.sub.deliver.<token>.
"""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

import msgspec
import nats
import nats.js.errors
import psycopg
import structlog
from nats.aio.client import Client as NATS
from nats.aio.msg import Msg

from command_handler.intake import error_reply
from command_handler.store import HEAD_SQL
from infra.db_errors import map_db_error
from infra.settings import Settings
from infra.tasks import reraise_if_cancelled
from memory_client.client import MemoryClient, PamspecError
from schemas.canonical import canonical_bytes
from schemas.errors import InvalidRequest, PamledgerError, ScopeNotFound, ServiceUnavailable
from schemas.subscriptions import (
    AckRequest, CloseRequest, PollRequest, ResumeRequest, SubscribeRequest, SubscriptionRef, descriptor,
)
from subscriptions.filters import Authorizer
from subscriptions.session import Session

log = structlog.get_logger(__name__)
_DECODERS: dict[str, Any] = {
    "open": msgspec.json.Decoder(SubscribeRequest), "ack": msgspec.json.Decoder(AckRequest),
    "poll": msgspec.json.Decoder(PollRequest), "resume": msgspec.json.Decoder(ResumeRequest),
    "close": msgspec.json.Decoder(CloseRequest), "status": msgspec.json.Decoder(SubscriptionRef),
}


class Gateway:
    def __init__(self, settings: Settings, nc: NATS, conn: psycopg.AsyncConnection[Any], authorizer: Authorizer):
        self.settings = settings
        self.nc = nc
        self.conn = conn
        self.authorizer = authorizer
        self.prefix = settings.subject_prefix
        self.sessions: dict[str, Session] = {}
        self.writer = MemoryClient(nc, self.prefix, timeout=10.0)
        self._subs: list[Any] = []

    async def serve(self) -> None:
        """Take over every open subscription, then answer requests until cancelled."""
        for subscription_id, request, start in await self._open_rows():
            session = self._session(subscription_id, request, start)
            await session.attach(None)
            self._start(session)
        for name in _DECODERS:
            self._subs.append(await self.nc.subscribe(f"{self.prefix}.sub.{name}", queue="pamledger-subscriptions",
                                                      cb=self._handle))
        log.info("gateway.serving", open_subscriptions=len(self.sessions))
        try:
            await asyncio.Event().wait()
        finally:
            for sub in self._subs:
                await sub.unsubscribe()
            for session in list(self.sessions.values()):
                if session.pump_task:
                    session.pump_task.cancel()
                await session.detach()

    # -- requests -------------------------------------------------------------------------------

    async def _handle(self, msg: Msg) -> None:
        name = msg.subject.rsplit(".", 1)[-1]
        try:
            request = _DECODERS[name].decode(msg.data)
        except (msgspec.DecodeError, msgspec.ValidationError) as exc:
            return await self._answer(msg, error_reply(InvalidRequest(f"malformed {name} request: {exc}",
                                                                      details={"reason": str(exc)}), None))
        try:
            result = await getattr(self, f"_{name}")(request)
            body = canonical_bytes({"result": result})
        except PamledgerError as exc:
            body = error_reply(exc, getattr(request, "operation_id", None))
        except psycopg.Error as exc:
            body = error_reply(map_db_error(exc), None)
        except PamspecError as exc:
            body = error_reply(PamledgerError(exc.message, details=exc.details, code=exc.code), None)  # type: ignore[arg-type]
        except nats.js.errors.APIError as exc:  # JetStream answered and refused: say what it said
            body = error_reply(PamledgerError(f"JetStream refused: {exc.description}", details={
                "err_code": exc.err_code, "description": exc.description}), None)
        except nats.errors.Error as exc:
            reraise_if_cancelled()
            body = error_reply(ServiceUnavailable(f"JetStream unavailable: {type(exc).__name__}"), None)
        await self._answer(msg, body)

    async def _answer(self, msg: Msg, body: bytes) -> None:
        if msg.reply:
            await msg.respond(body)

    async def _open(self, request: SubscribeRequest) -> dict[str, Any]:
        head = await self._head_of(request.scope_id)
        if request.after_sequence is not None and request.after_sequence > head:
            raise InvalidRequest("after_sequence is beyond the ledger head",
                                 details={"after_sequence": request.after_sequence, "ledger_head": head})
        start = request.after_sequence if request.after_sequence is not None else head
        subscription_id = f"sub:{uuid.uuid4()}"
        session = self._session(subscription_id, request, start)
        described = descriptor(subscription_id, request, start, session.deliver_subject)
        try:  # the consumer first: if JetStream refuses, nothing was recorded
            await session.attach(start)
            await self.writer.command("open_subscription", {
                "scope_id": request.scope_id, "subscription_id": subscription_id,
                "actor": msgspec.to_builtins(request.actor), "subscription": described})
            await self.conn.execute(
                "INSERT INTO subscriptions (subscription_id, scope_id, request, start_sequence)"
                " VALUES (%s, %s, %s, %s)", (subscription_id, request.scope_id, msgspec.json.encode(request), start))
        except BaseException:
            self.sessions.pop(subscription_id, None)
            await session.detach()
            await session.delete_consumer()
            raise
        self._start(session)
        log.info("subscription.opened", subscription_id=subscription_id, start_sequence=start)
        return {**described, "mode": request.delivery.mode, "delivery_subject": session.deliver_subject,
                "generation": session.generation}

    async def _ack(self, request: AckRequest) -> dict[str, Any]:
        session = self._get(request.subscription_id)
        await session.ack(request.ledger_sequence)
        return {"subscription_id": session.id, "acknowledged_sequence": session.client_acked}

    async def _poll(self, request: PollRequest) -> dict[str, Any]:
        session = self._get(request.subscription_id)
        if session.request.delivery.mode != "poll":
            raise InvalidRequest("this subscription pushes; poll needs delivery.mode 'poll'",
                                 details={"subscription_id": session.id})
        deadline = asyncio.get_running_loop().time() + request.wait_ms / 1000
        events: list[Any] = []
        while len(events) < request.max_events:
            remaining = deadline - asyncio.get_running_loop().time()
            batch = await self._fetch_checked(session, request.max_events - len(events), max(remaining, 0.05))
            if session.closing:
                break
            for sequence, event, raw in batch:
                if event is not None:
                    events.append({"ledger_sequence": sequence, "event": msgspec.Raw(raw)})
                    session.last_delivered = sequence
            session.client_acked = session.entries[-1].sequence if session.entries else session.client_acked
            await session.settle()  # poll acknowledges what it returns
            if events or remaining <= 0:
                break
        return {"subscription_id": session.id, "events": events, "last_delivered_sequence": session.last_delivered,
                "closed": session.closing}

    async def _resume(self, request: ResumeRequest) -> dict[str, Any]:
        session = self._get(request.subscription_id)
        if session.pump_task:
            session.pump_task.cancel()
        await session.detach()
        await session.attach(request.after_sequence)
        self._start(session)
        return {"subscription_id": session.id, "delivery_subject": session.deliver_subject,
                "resumed_after": session.client_acked, "generation": session.generation}

    async def _close(self, request: CloseRequest) -> dict[str, Any]:
        session = self._get(request.subscription_id)
        await self.close(session, request.reason)
        return {"subscription_id": session.id, "reason": request.reason,
                "last_delivered_sequence": session.last_delivered}

    async def _status(self, request: SubscriptionRef) -> dict[str, Any]:
        session = self._get(request.subscription_id)
        return {"subscription_id": session.id, "last_delivered_sequence": session.last_delivered,
                "acknowledged_sequence": session.client_acked, "unacked": session.unacked()}

    # -- delivery -------------------------------------------------------------------------------

    async def _pump(self, session: Session) -> None:
        """Push loop: fetch, check, push, settle; keepalives when idle; backpressure per policy."""
        delivery = session.request.delivery
        keepalive = (delivery.keepalive_interval_ms or 0) / 1000
        busy = True
        while not session.closing:
            try:
                if session.unacked() >= delivery.max_unacked and await self._backpressure(session):
                    continue
                room = delivery.max_unacked - session.unacked()
                # Caught up: wait for one event (fetch returns the moment it lands), then take what is
                # pending in batches; a lingering fetch(n) would otherwise hold events until n arrive.
                want = min(room, delivery.batching_max_events or 256) if busy else 1
                batch = await self._fetch_checked(session, want, keepalive or 5.0)
                busy = bool(batch)
                if not batch:  # nothing new (or a stale status from nats-py): never spin
                    await asyncio.sleep(0.01)
                if not batch and keepalive and not session.closing:
                    await session.notify("keepalive")
                for sequence, event, raw in batch:
                    if event is not None:
                        await session.push(sequence, raw)
                await session.settle()
            except (nats.errors.Error, asyncio.TimeoutError) as exc:
                reraise_if_cancelled()
                log.warning("subscription.pump_retrying", subscription_id=session.id, error=type(exc).__name__)
                await asyncio.sleep(0.5)
                await self._reattach(session)

    async def _backpressure(self, session: Session) -> bool:
        """True when the pump should loop again (it waited, dropped or closed)."""
        delivery = session.request.delivery
        policy = delivery.backpressure_policy or "close_on_lag"
        if policy == "drop_oldest":
            await session.drop_oldest()
            return True
        if policy == "close_on_lag" and session.oldest_unacked_age() * 1000 > delivery.max_lag_ms:
            await self.close(session, "backpressure")
            return True
        await asyncio.sleep(0.02)
        return True

    async def _fetch_checked(self, session: Session, limit: int, timeout: float) -> list[Any]:
        try:
            return await session.fetch(max(limit, 1), timeout)
        except PermissionError as denied:
            log.info("subscription.access_revoked", subscription_id=session.id, at=denied.args[0])
            await self.close(session, "access_revoked")
            return []

    async def _reattach(self, session: Session) -> None:
        try:
            await session.detach()
            await session.attach(None)
        except nats.errors.Error as exc:
            reraise_if_cancelled()
            log.warning("subscription.reattach_failed", subscription_id=session.id, error=type(exc).__name__)

    async def close(self, session: Session, reason: str) -> None:
        """Terminal close: a close notice to the subscriber, subscription_closed in the ledger, no more
        delivery."""
        if session.closing:
            return
        session.closing = reason
        if session.pump_task and session.pump_task is not asyncio.current_task():
            session.pump_task.cancel()
        await session.notify("closed", reason=reason)
        await self.writer.command("close_subscription", {
            "scope_id": session.request.scope_id, "subscription_id": session.id,
            "actor": msgspec.to_builtins(session.request.actor), "reason": reason,
            "last_delivered_sequence": session.last_delivered})
        await self.conn.execute(
            "UPDATE subscriptions SET status = 'closed', close_reason = %s, last_delivered_sequence = %s,"
            " closed_at = now() WHERE subscription_id = %s", (reason, session.last_delivered, session.id))
        await session.detach()
        await session.delete_consumer()
        log.info("subscription.closed", subscription_id=session.id, reason=reason,
                 last_delivered_sequence=session.last_delivered)

    # -- bookkeeping ----------------------------------------------------------------------------

    def _session(self, subscription_id: str, request: SubscribeRequest, start: int) -> Session:
        session = Session(subscription_id, request, start, self.nc, self.settings.stream_name, self.prefix,
                          self.settings.partition, self.authorizer)
        self.sessions[subscription_id] = session
        return session

    def _start(self, session: Session) -> None:
        if session.request.delivery.mode == "push":
            session.pump_task = asyncio.create_task(self._pump(session))

    def _get(self, subscription_id: str) -> Session:
        session = self.sessions.get(subscription_id)
        if session is None or session.closing:
            raise InvalidRequest("unknown or closed subscription", details={"subscription_id": subscription_id})
        return session

    async def _head_of(self, scope_id: str) -> int:
        if await (await self.conn.execute("SELECT 1 FROM scopes WHERE scope_id = %s", (scope_id,))).fetchone() is None:
            raise ScopeNotFound("scope not found", details={"scope_id": scope_id})
        row = await (await self.conn.execute(HEAD_SQL)).fetchone()
        return int(row[0]) if row else 0

    async def _open_rows(self) -> list[tuple[str, SubscribeRequest, int]]:
        cur = await self.conn.execute(
            "SELECT subscription_id, request, start_sequence FROM subscriptions WHERE status = 'open'")
        decoder = msgspec.json.Decoder(SubscribeRequest)
        return [(r[0], decoder.decode(bytes(r[1])), int(r[2])) for r in await cur.fetchall()]
