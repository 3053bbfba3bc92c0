"""The Subscribe gateway: open, deliver (push or poll), ack, resume and close subscriptions.

It leads per partition (advisory lock, like the writer and projector); a standby takes over every open
subscription from the `subscriptions` table, each from its stored position, when the leader dies.
Live delivery fans out in process: one partition feed (subscriptions.feed) reads each new event once
and offers it to the subscriptions of its scope; a subscription that is behind reads its own catch-up
consumer until it can join (subscriptions.session); each push subscription has a pump
(subscriptions.pump). The subscriptions table and the leader's session: subscriptions.store.
Subjects (queue group `pamledger-subscriptions`): {prefix}.sub.open | ack | poll | resume | close |
status | list; pushed events go to {prefix}.sub.deliver.<token>. With several partitions each partition
has its own gateway (lock, feed, stream, subscriptions); partition 0's takes the public subjects and routes
the other partitions' requests to `{prefix}.sub.p<partition>.<call>` (subscriptions.routing).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
import uuid
from typing import Any

import msgspec
import nats
import psycopg
import structlog
from nats.aio.client import Client as NATS
from nats.aio.msg import Msg

from authz.tokens import BadCredential, bearer_token, token_id_of
from infra.cleanup import run_to_end
from infra.ledger_identity import Disagreement, stream_disagreement, wait_for_agreement
from infra.scopes import scope_partitions
from infra.partitions import partition_stream
from infra.request_shell import DelegationGate, DenialSink, Deny, Policy, RequestContext, RequestShell
from infra.requester import CommandRequester
from infra.settings import Settings
from infra.stuck import StuckState
from infra.status import status_reply
from pamledger_client.protocol.subjects import status_subject, subscription_subject
from pamledger_client.protocol.tasks import stop_task
from schemas.errors import DuplicateOperation, InvalidRequest, ScopeNotFound, ServiceUnavailable
from schemas.replies import OPERATION_HEADER, error_reply
from schemas.subscriptions import (
    AckRequest, CloseRequest, ListRequest, PollRequest, ResumeRequest, SubscribeRequest, SubscriptionRef, descriptor,
)
from subscriptions.closes import Closes
from subscriptions.feed import PartitionFeed
from subscriptions.filters import Authorizer
from subscriptions.poll import poll
from subscriptions.pump import pump
from subscriptions.requests import DECODERS, decode_request, decode_stored, result_body
from subscriptions.routing import RequestRoutes, partition_subscription_subject
from subscriptions.session import Session
from subscriptions.store import LOST_CONNECTION, SubscriptionStore, subscriptions_disagreement

log = structlog.get_logger(__name__)


REVOCATION_SWEEP_SECONDS = 0.5  # as often as the grants registry refreshes (auth.refresh_seconds)


def _credential_of(context: RequestContext) -> str | None:
    """The token id an authenticated request came with (None: auth off, or unauthenticated)."""
    if not context.authenticated or context.credential is None:
        return None
    try:
        return token_id_of(bearer_token(context.credential))
    except BadCredential:
        return None


class Gateway:
    def __init__(self, settings: Settings, nc: NATS, store: SubscriptionStore, authorizer: Authorizer,
                 policy: Policy | None = None, denials: DenialSink | None = None, service_token: str | None = None,
                 delegations: DelegationGate | None = None, partition: int | None = None):
        """`partition`: the one this gateway leads (None: the settings' own, as with one partition)."""
        self.settings = settings
        self.partition = settings.partition if partition is None else partition
        several = settings.partitions > 1
        self.stream = partition_stream(settings.stream_name, self.partition) if several else settings.stream_name
        # Partition 0's gateway of several takes the public subjects and routes; another partition's gateway
        # takes only what is routed to it.
        self.public = not several or self.partition == 0
        self.routes = RequestRoutes(store, settings.partitions, self._leads) if several and self.public else None
        self.role = "gateway" if self.public else f"gateway.p{self.partition}"
        # Per request; the authorizer decides per delivered event. `denials` records refusals (auth on).
        self.shell = RequestShell(policy, denials=denials, delegations=delegations)
        self.nc = nc
        self.store = store
        self.authorizer = authorizer
        self.prefix = settings.subject_prefix
        self.sessions: dict[str, Session] = {}
        self.writer = CommandRequester(nc, self.prefix, timeout=10.0, token=service_token)
        self.feed = PartitionFeed(nc, self.stream, self.prefix, self.partition, self._revoked,
                                  settings.gateway, self._stuck_state())
        self._subs: list[Any] = []
        self._background: set[asyncio.Task[Any]] = set()
        self.closes = Closes(store, self.writer)
        self._close_lock = asyncio.Lock()  # one close at a time: a retried close never races the first
        self.unreadable: dict[str, str] = {}  # stored subscriptions whose request does not decode: id -> why

    async def _disagreement(self) -> Disagreement | None:
        """What the gateway checks before it serves: the stream, then the subscriptions' positions."""
        conn, partition = self.store.conn, self.partition
        return (await stream_disagreement(conn, self.nc.jetstream(), self.stream, partition)
                or await subscriptions_disagreement(conn, partition))

    async def serve(self) -> None:
        """Follow the partition, take over every open subscription, then answer requests until cancelled."""
        await wait_for_agreement("gateway", self._disagreement)
        feed_task = asyncio.create_task(self.feed.run())
        flusher = asyncio.create_task(self._flush_forever())
        sweeper = asyncio.create_task(self._close_revoked_credentials())
        try:
            for subscription_id, request, position, credential_id in await self._open_rows():
                session = self._session(subscription_id, request, position)
                session.credential_id = credential_id
                self._start(session)
            self.closes.pending.update(await self._closing_rows())
            for name in DECODERS:
                # nats-py calls a subscription's callback for one message at a time: a poll waiting up to
                # wait_ms would hold up every other subscription's poll, so each poll gets its own task
                # (polls of one subscription still take turns: Session.poll_lock).
                handle = self._handle_in_task if name == "poll" else self._handle
                subject = subscription_subject(self.prefix, name) if self.public \
                    else partition_subscription_subject(self.prefix, self.partition, name)
                self._subs.append(await self.nc.subscribe(subject, queue="pamledger-subscriptions", cb=handle))
            # Last: `status.gateway` (partition p of several: `status.gateway.p<p>`) answering means requests are
            # served.
            self._subs.append(await self.nc.subscribe(status_subject(self.prefix, self.role), cb=self._leader_status))
            await self.nc.flush()
            log.info("gateway.serving", open_subscriptions=len(self.sessions))
            # Both run forever: if either ends it failed, and the gateway restarts (and takes over again).
            done, _ = await asyncio.wait({feed_task, flusher}, return_when=asyncio.FIRST_COMPLETED)
            for task in done:
                task.result()
            raise RuntimeError("the gateway's feed or position flusher stopped")
        finally:
            await run_to_end(self._stop(feed_task, flusher, sweeper))

    async def _stop(self, *tasks: asyncio.Task[Any]) -> None:
        """Stop serving: no more requests, every task stopped (none left to take the lock again), the
        positions stored."""
        for sub in self._subs:
            with contextlib.suppress(nats.errors.Error):
                await sub.unsubscribe()
        for task in (*tasks, *self._background, *(s.pump_task for s in self.sessions.values() if s.pump_task)):
            await stop_task(task)
        for session in list(self.sessions.values()):
            await session.close_reader()
        with contextlib.suppress(psycopg.Error):
            await self._flush_positions()

    async def _leader_status(self, msg: Msg) -> None:
        def details() -> dict[str, Any]:
            live = sum(1 for s in self.sessions.values() if s.live)
            return {"partition": self.partition, "pid": os.getpid(),
                    "open_subscriptions": len(self.sessions), "live_subscriptions": live,
                    "feed_sequence": self.feed.position, "feed_following": self.feed.following.is_set(),
                    "stuck": self.feed.stuck.report(), **self.closes.report(),
                    "unreadable_subscriptions": self.unreadable,
                    "stuck_subscriptions": {s.id: s.stuck.report() for s in self.sessions.values() if s.stuck.current}}

        health = {"role": "gateway", "leader": True, "ok": self.feed.stuck.current is None}
        await msg.respond(status_reply(self.shell.policy, msg.subject, msg.headers, health, details))

    # -- requests -------------------------------------------------------------------------------

    async def _handle_in_task(self, msg: Msg) -> None:
        task = asyncio.create_task(self._handle(msg))
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def _handle(self, msg: Msg) -> None:
        name = msg.subject.rsplit(".", 1)[-1]
        if self.routes is not None and await self._routed_elsewhere(name, msg):
            return
        body = await self.shell.answer(f"sub.{name}", msg.subject, msg.data, msg.headers,
                                       lambda data: decode_request(name, data),
                                       lambda request, context: self._dispatch(name, request, context))
        await self._answer(msg, body)

    def _leads(self, subscription_id: str) -> bool:
        return subscription_id in self.sessions

    async def _routed_elsewhere(self, name: str, msg: Msg) -> bool:
        """Hand a request of another partition to that partition's gateway, reply subject and headers (the
        credential) unchanged: it checks and answers as it would have. True once handed on or answered."""
        assert self.routes is not None
        try:
            partition = await self.routes.partition_for(name, msg.data)
        except psycopg.Error:  # answered, retryable, not dropped; the flusher finds the lost session
            if msg.reply:
                with contextlib.suppress(nats.errors.Error):
                    await msg.respond(error_reply(ServiceUnavailable(
                        "the Subscribe gateway cannot read which partition this request is of; retry"),
                        (msg.headers or {}).get(OPERATION_HEADER)))
            return True
        if partition is None or partition == self.partition:
            return False
        await self.nc.publish(partition_subscription_subject(self.prefix, partition, name), msg.data,
                              reply=msg.reply, headers=msg.headers)
        return True

    async def _dispatch(self, name: str, request: Any, context: RequestContext) -> bytes:
        if name == "list":
            return result_body(await self._list(request, context))
        if name != "open" and context.authenticated:
            await self._check_owner(name, request.subscription_id, context)
        if name == "open" and context.authenticated:
            await self._check_delivery(request.delivery.subject, context, "sub.open")
        if name == "resume" and context.authenticated and request.delivery_subject is not None:
            await self._check_delivery(request.delivery_subject, context, "sub.resume")
        if name in ("open", "resume"):
            return result_body(await getattr(self, f"_{name}")(request, _credential_of(context)))
        return result_body(await getattr(self, f"_{name}")(request))

    async def _check_delivery(self, subject: str | None, context: RequestContext, request: str) -> None:
        """Where auth is enforced, pushes go only to the caller's own inbox `_INBOX.<token_id>.…` (a NATS
        pamledger runs lets a token receive nowhere else): naming another's inbox would make the gateway
        deliver one actor's events to whoever listens there (docs/security.md, "Transport")."""
        try:
            own = f"_INBOX.{token_id_of(bearer_token(context.credential))}."
        except BadCredential:  # authenticated, so it was well-formed; refuse rather than guess
            own = None
        if subject is None or (own is not None and subject.startswith(own)):
            return
        await self._deny(context, request, Deny(
            "subscription.foreign_inbox", message="delivery.subject must be under the caller's own inbox"
            " _INBOX.<token_id>.", caller={"actor_id": context.principal.actor_id,
                                            "actor_kind": context.principal.actor_kind}))

    async def _deny(self, context: RequestContext, request: str, denial: Deny) -> None:
        log.info("request.denied", request=request, rule_id=denial.rule_id)
        if self.shell.denials is not None:
            await self.shell.denials.denied(context, request, denial)
        raise denial.error()

    async def _check_owner(self, name: str, subscription_id: str, context: RequestContext) -> None:
        """Poll, ack, resume, status and close belong to the actor that opened the subscription. Another
        actor's id and an unknown id are refused alike, so a guessed id says nothing about what exists."""
        session = self.sessions.get(subscription_id)
        owner = session.request.actor.actor_id if session is not None else await self.store.owner_of(subscription_id)
        if owner == context.principal.actor_id:
            return
        await self._deny(context, f"sub.{name}", Deny(
            "subscription.not_owner", message="no subscription of this actor has this id",
            caller={"actor_id": context.principal.actor_id, "actor_kind": context.principal.actor_kind}))

    async def _answer(self, msg: Msg, body: bytes) -> None:
        if msg.reply:
            await msg.respond(body)

    async def _open(self, request: SubscribeRequest, credential_id: str | None = None) -> dict[str, Any]:
        if request.operation_id is not None:
            earlier = await self._opened_by(request, request.operation_id)
            if earlier is not None:
                return earlier
        head = await self._head_of(request.scope_id)
        if request.after_sequence is not None and request.after_sequence > head:
            raise InvalidRequest("after_sequence is beyond the ledger head",
                                 details={"after_sequence": request.after_sequence, "ledger_head": head})
        start = request.after_sequence if request.after_sequence is not None else head
        subscription_id = f"sub:{uuid.uuid4()}"
        session = self._session(subscription_id, request, start)
        session.credential_id = credential_id
        described = descriptor(subscription_id, request, start, session.deliver_subject)
        try:
            await self.writer.command("open_subscription", {
                "scope_id": request.scope_id, "subscription_id": subscription_id,
                "actor": msgspec.to_builtins(request.actor), "subscription": described})
            await self.store.insert(subscription_id, request.scope_id, msgspec.json.encode(request), start,
                                    request.operation_id, credential_id)
        except BaseException:
            self.sessions.pop(subscription_id, None)
            raise
        session.stored_position = start
        self._start(session)
        log.info("subscription.opened", subscription_id=subscription_id, start_sequence=start)
        return self._opened(session, start)

    def _opened(self, session: Session, start: int) -> dict[str, Any]:
        request = session.request
        return {**descriptor(session.id, request, start, session.deliver_subject), "mode": request.delivery.mode,
                "delivery_subject": session.deliver_subject, "generation": session.generation}

    async def _opened_by(self, request: SubscribeRequest, operation_id: str) -> dict[str, Any] | None:
        """A retried open (same operation_id) gets the subscription its first attempt made."""
        row = await self.store.opened_by(operation_id)
        if row is None:
            return None
        if row[1] != msgspec.json.encode(request):
            raise DuplicateOperation("operation_id was already used to open a different subscription",
                                     details={"operation_id": request.operation_id, "subscription_id": row[0]})
        session = self.sessions.get(row[0])
        if session is None or session.closing:
            raise InvalidRequest("the subscription this operation opened is closed",
                                 details={"operation_id": request.operation_id, "subscription_id": row[0]})
        return self._opened(session, row[2])

    async def _list(self, request: ListRequest, context: RequestContext) -> dict[str, Any]:
        """The caller's own subscriptions; an administrator's (and everyone's with auth off): all of them."""
        policy, actor_id = self.shell.policy, context.principal.actor_id
        mine = actor_id if context.authenticated and not policy.administers(actor_id) else None
        rows = await self.store.listing(request.all, mine, request.limit + 1)
        return {"subscriptions": rows[:request.limit], "truncated": len(rows) > request.limit}

    async def _ack(self, request: AckRequest) -> dict[str, Any]:
        session = self._get(request.subscription_id)
        try:
            session.ack(request.ledger_sequence)
        except InvalidRequest:
            log.info("subscription.ack_refused", subscription_id=session.id, ledger_sequence=request.ledger_sequence,
                     acknowledged=session.client_acked, unacked=len(session.unacked),
                     first_unacked=session.unacked[0][0] if session.unacked else None, generation=session.generation)
            raise
        return {"subscription_id": session.id, "acknowledged_sequence": session.client_acked}

    async def _poll(self, request: PollRequest) -> dict[str, Any]:
        ended = await self._ended_at(request.subscription_id)
        if ended is not None:  # a closed subscription delivers nothing more: an empty answer, not an error
            return {"subscription_id": request.subscription_id, "events": [], "last_delivered_sequence": ended,
                    "closed": True}
        session = self._get(request.subscription_id)
        if session.request.delivery.mode != "poll":
            raise InvalidRequest("this subscription pushes; poll needs delivery.mode 'poll'",
                                 details={"subscription_id": session.id})
        async with session.poll_lock:
            return await poll(session, request, self._close_revoked)

    async def _resume(self, request: ResumeRequest, credential_id: str | None = None) -> dict[str, Any]:
        session = self._get(request.subscription_id)
        after = session.client_acked if request.after_sequence is None else request.after_sequence
        head = await self._head_of(session.request.scope_id)
        if after > head:  # nothing would ever be delivered before the ledger caught up with it
            raise InvalidRequest("after_sequence is beyond the ledger head",
                                 details={"after_sequence": after, "ledger_head": head})
        subject = request.delivery_subject
        if subject is not None and not session.push_mode:
            raise InvalidRequest("a poll subscription has no delivery subject", details={"subscription_id": session.id})
        if credential_id != session.credential_id and session.push_mode and subject is None:
            raise InvalidRequest("resumed with another token: name delivery_subject, an inbox of that token",
                                 details={"subscription_id": session.id})
        moved = subject is not None and subject != session.deliver_subject
        if moved or credential_id != session.credential_id:
            await self._rebind(session, subject if moved else None, credential_id)
        await self._stop_pump(session)
        await session.close_reader()
        session.reposition(after)  # a poll still running sees the new generation and moves nothing (poll.py)
        self._start(session)
        return {"subscription_id": session.id, "delivery_subject": session.deliver_subject,
                "resumed_after": session.client_acked, "generation": session.generation}

    async def _rebind(self, session: Session, subject: str | None, credential_id: str | None) -> None:
        """Deliver to `subject` (the resumer's inbox) under `credential_id` from now on, stored first."""
        request = session.request
        if subject is not None:
            request = msgspec.structs.replace(request, delivery=msgspec.structs.replace(request.delivery,
                                                                                        subject=subject))
        await self.store.rebind(session.id, msgspec.json.encode(request), credential_id)
        session.request, session.credential_id = request, credential_id
        if subject is not None:
            session.deliver_subject = subject
        log.info("subscription.rebound", subscription_id=session.id, new_subject=subject is not None)

    async def _close_revoked_credentials(self) -> None:
        """Close every subscription whose token was revoked or expired, or whose delegation was revoked or
        ended (`access_revoked`, at the last delivered sequence), whether or not an event arrives: looked at
        every REVOCATION_SWEEP_SECONDS (delegations: one read of the live ones, when any subscription has one)."""
        while True:
            await asyncio.sleep(REVOCATION_SWEEP_SECONDS)
            sessions = [s for s in self.sessions.values() if not s.closing]
            delegated = sorted({d for s in sessions if (d := s.request.actor.delegation_id) is not None})
            try:
                live = await self.store.live_delegations(delegated) if delegated else set()
            except psycopg.Error:
                continue  # the database is away: the next sweep looks again (tokens are checked meanwhile)
            for session in sessions:
                credential, delegation = session.credential_id, session.request.actor.delegation_id
                revoked = credential is not None and not self.authorizer.credential_live(credential)
                ended = delegation is not None and delegation not in live
                if (revoked or ended) and not session.closing:
                    log.info("subscription.revoked", subscription_id=session.id,
                             what="delegation" if ended else "credential")
                    await self._close_revoked(session, session.last_delivered)

    async def _close(self, request: CloseRequest) -> dict[str, Any]:
        """Answered only once the close is durable; a repeated close is answered the same way."""
        session = self.sessions.get(request.subscription_id)
        if session is None:  # closed before (a retry whose first answer was lost): the same answer
            ended = await self._ended_at(request.subscription_id)
            if ended is None:
                raise InvalidRequest("unknown subscription", details={"subscription_id": request.subscription_id})
            return {"subscription_id": request.subscription_id, "reason": request.reason,
                    "last_delivered_sequence": ended}
        if not await self.close(session, request.reason):
            raise ServiceUnavailable("delivery stopped, but the close is not recorded yet (database unavailable):"
                                     " retry it", details={"subscription_id": session.id})
        return {"subscription_id": session.id, "reason": session.closing,
                "last_delivered_sequence": session.last_delivered}

    async def _status(self, request: SubscriptionRef) -> dict[str, Any]:
        session = self._get(request.subscription_id)
        return {"subscription_id": session.id, "last_delivered_sequence": session.last_delivered,
                "acknowledged_sequence": session.client_acked, "unacked": len(session.unacked),
                "live": session.live, "stuck": session.stuck.report()}

    # -- delivery -------------------------------------------------------------------------------

    def _revoked(self, session: Session, sequence: int) -> None:
        """The feed found the actor may no longer read `sequence`: close the subscription there."""
        task = asyncio.create_task(self._close_revoked(session, sequence))
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def _close_revoked(self, session: Session, sequence: int) -> None:
        log.info("subscription.access_revoked", subscription_id=session.id, at=sequence)
        await self.close(session, "access_revoked")

    async def _stop_pump(self, session: Session) -> None:
        task, session.pump_task = session.pump_task, None
        if task is not None and task is not asyncio.current_task():
            await stop_task(task)

    async def _flush_forever(self) -> None:
        """Store positions and finish pending closes every `flush_seconds`; check the database session when
        nothing was written for `database_check_seconds`. A lost session is replaced in place (the lock
        taken again): requests that need the database answer service_unavailable meanwhile, and polls and
        pushes, which need only NATS, go on."""
        checked = time.monotonic()
        while True:
            await asyncio.sleep(self.settings.gateway.flush_seconds)
            try:
                flushed = await self._flush_positions()
                for session in list(self.closes.unmarked.values()):  # closes the database missed
                    await self.close(session, session.closing or "unsubscribed")
                if self.closes.pending:
                    await self.closes.finish_pending()
                if flushed or time.monotonic() - checked >= self.settings.gateway.database_check_seconds:
                    if not flushed:
                        await self.store.check()
                    checked = time.monotonic()
            except LOST_CONNECTION as exc:
                log.warning("gateway.database_lost", error=type(exc).__name__)
                await self.store.reconnect({s.id: s.stored_position for s in self.sessions.values()
                                            if s.stored_position >= 0 and not s.closing})
                log.info("gateway.database_reconnected", open_subscriptions=len(self.sessions))
            except psycopg.Error as exc:
                log.warning("subscription.flush_failed", error=type(exc).__name__)

    async def _flush_positions(self) -> bool:
        """Store acknowledged positions that moved, in one statement (True: there were some)."""
        moved = [s for s in self.sessions.values() if s.client_acked != s.stored_position and not s.closing]
        if not moved:
            return False
        positions = {s.id: (s.client_acked, s.last_delivered) for s in moved}
        await self.store.store_positions(positions)
        for session in moved:
            session.stored_position = positions[session.id][0]
        return True

    async def close(self, session: Session, reason: str) -> bool:
        """Terminal close: no more delivery, the row marked 'closing', a close notice to the subscriber,
        then subscription_closed in the ledger (Closes). True once the row is marked: from then on a crash
        cannot resume delivery. False with the database away: delivery stays stopped, and the flusher or a
        retried close records it. Any other failure to mark the row undoes the stop."""
        async with self._close_lock:  # held only while deciding: never across the writer's round trip
            if self.sessions.get(session.id) is not session:
                return True  # closed meanwhile
            stopped_here = not session.closing
            if stopped_here:
                session.closing = reason
                self.feed.remove(session)
                await self._stop_pump(session)
            try:
                if not await self.closes.mark(session):
                    return False
            except Exception:
                if stopped_here:
                    self._reopen(session)
                raise
            self.sessions.pop(session.id, None)
        await session.close_reader()
        with contextlib.suppress(nats.errors.Error):
            await session.notify("closed", reason=session.closing)
        with contextlib.suppress(*LOST_CONNECTION):  # finished by the flusher after a reconnect
            await self.closes.finish(session.id)
        log.info("subscription.closed", subscription_id=session.id, reason=session.closing,
                 last_delivered_sequence=session.last_delivered)
        return True

    def _reopen(self, session: Session) -> None:
        """Undo a close that could not be recorded: delivery goes on from what was scanned."""
        session.closing = None
        session.fall_back()
        self._start(session)

    # -- bookkeeping ----------------------------------------------------------------------------

    def _session(self, subscription_id: str, request: SubscribeRequest, start: int) -> Session:
        session = Session(subscription_id, request, start, self.nc, self.stream, self.prefix,
                          self.partition, self.authorizer, self.settings.gateway)
        session.stuck = self._stuck_state()
        self.sessions[subscription_id] = session
        return session

    def _stuck_state(self) -> StuckState:
        return StuckState(self.settings.follower.retry_first_seconds, self.settings.follower.retry_max_seconds)

    def _start(self, session: Session) -> None:
        """Push subscriptions join the feed (buffering from now on) and get a pump; poll ones read on poll."""
        if session.push_mode:
            self.feed.add(session)
            session.pump_task = asyncio.create_task(pump(session, self.feed, self.close, self._close_revoked))

    async def _ended_at(self, subscription_id: str) -> int | None:
        """The last delivered sequence of a subscription that was closed, None for any other id."""
        session = self.sessions.get(subscription_id)
        if session is not None:
            return session.last_delivered if session.closing else None
        ended = self.closes.ended_at(subscription_id)
        return ended if ended is not None else await self.store.ended_at(subscription_id)

    def _get(self, subscription_id: str) -> Session:
        session = self.sessions.get(subscription_id)
        if session is None or session.closing:
            raise InvalidRequest("unknown or closed subscription", details={"subscription_id": subscription_id})
        return session

    async def _head_of(self, scope_id: str) -> int:
        """The ledger head, in the same round trip as the check that the scope exists."""
        known, head = await self.store.head_of(scope_id)
        if not known:
            raise ScopeNotFound("scope not found", details={"scope_id": scope_id})
        if self.settings.partitions > 1:
            await self._in_own_partition(scope_id)
        return head

    async def _in_own_partition(self, scope_id: str) -> None:
        """With several partitions this gateway follows its own partition's stream only, and opens are routed
        to their scope's partition (subscriptions.routing): a scope of another partition that still reaches it
        (sent to `sub.p<p>.open` straight) is refused, never subscribed to a feed that would stay silent."""
        partition = (await scope_partitions(self.store.conn, [scope_id])).get(scope_id, self.partition)
        if partition != self.partition:
            raise InvalidRequest(f"this is the Subscribe gateway of partition {self.partition}; this scope is"
                                 f" in partition {partition}", details={"scope_id": scope_id, "partition": partition})

    async def _open_rows(self) -> list[tuple[str, SubscribeRequest, int, str | None]]:
        """Open subscriptions, the position each resumes from (acknowledged, else where it started) and the
        credential it runs under."""
        return decode_stored(await self.store.open_rows(), self.unreadable)

    async def _closing_rows(self) -> dict[str, tuple[SubscribeRequest, str, int]]:
        """Closes an earlier leader decided but could not write to the ledger."""
        rows = decode_stored(await self.store.closing_rows(), self.unreadable)
        return {s: (request, reason, last) for s, request, reason, last in rows}
