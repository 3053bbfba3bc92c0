"""The Python SDK: MemoryClient (async) and SyncMemoryClient, speaking the NATS binding.

Writes carry an idempotency key (one is generated when the caller gives none), so the client can safely
retry a write whose reply was lost (timeout, no writer during fail-over, service_unavailable).
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Callable
from typing import Any, cast

import msgspec
import nats.errors
from nats.aio.client import Client as NATS

from pamledger_client.config import ClientConfig
from pamledger_client.connection import message_size, open_nats
from pamledger_client.errors import PamspecError
from pamledger_client.objects import ObjectCommands
from pamledger_client.protocol.canonical import canonical_bytes, decode_json
from pamledger_client.protocol.headers import ACTOR_HEADER, AUTHORIZATION_HEADER, OPERATION_HEADER
from pamledger_client.protocol.requests import request_with_retries
from pamledger_client.protocol.subjects import command_subject, query_subject, status_subject, subscription_subject
from pamledger_client.protocol.tasks import reraise_if_cancelled
from pamledger_client.protocol.values import refusal
from pamledger_client.subscription import Subscription
from pamledger_client.tracing import request_span
from pamledger_client.types import History, MemoryEnvelope, QueryPage, SearchPage, WriteResult

__all__ = ["MemoryClient", "PamspecError", "SyncMemoryClient", "SyncSubscription"]

_encoder = msgspec.json.Encoder()
_raw_reply = msgspec.json.Decoder(dict[str, msgspec.Raw])


def _result_raw(data: bytes) -> dict[str, Any]:
    """A reply with its result left as msgspec.Raw; an error reply decoded whole."""
    reply = _raw_reply.decode(data)
    return reply if "result" in reply else decode_json(data)


# Queries that read what followers applied (the projection, the index): they wait for this client's writes.
_SEES_OWN_WRITES = frozenset({"query", "search", "related"})


def _too_large(size: int, limit: int) -> PamspecError:
    """What the writer answers over its own limit, raised before NATS refuses the message outright (the
    server would close the connection, losing every request in flight on it). Headers count too."""
    return PamspecError.of("invalid_request", f"message of {size} bytes (payload and headers) exceeds the NATS "
                           f"server's limit of {limit}",
                           {"limit_bytes": limit, "size_bytes": size})


class MemoryClient(ObjectCommands):
    """Async client. Use `await MemoryClient.connect()` (or `connect(url)`) or pass an existing nats connection.

    relate / redact / promote / correct_provenance come from pamledger_client.objects.ObjectCommands."""

    def __init__(self, nc: NATS, prefix: str = "pamledger", timeout: float = 10.0, retries: int = 5,
                 actor: dict[str, Any] | None = None, token: str | None = None):
        self.nc = nc
        self.actor = actor  # named in the Pam-Actor header of reads, queries and subscription requests
        self.token = token  # the bearer credential every request carries (None: none is sent)
        self.prefix = prefix
        self.timeout = timeout
        self.retries = retries
        self.last_sequence = 0
        self._owns = False

    @classmethod
    async def connect(cls, url: str | None = None, prefix: str | None = None,
                      timeout: float | None = None, actor: dict[str, Any] | None = None,
                      token: str | None = None, config: ClientConfig | None = None) -> MemoryClient:
        """Connect to `url`, or with none to the local service the CLI would use (PAMLEDGER_NATS_URL, then
        the state dir's servers.json); prefix and timeout default to PAMLEDGER_SUBJECT_PREFIX and
        PAMLEDGER_REQUEST_TIMEOUT_SECONDS. Nothing listening raises PamspecError(service_unavailable) at once.
        `actor` ({actor_id, actor_kind}) names the caller of every read, query and subscription request.
        `token` is the credential sent with every request: else PAMLEDGER_TOKEN, else the administrative token
        `make run` left in the state dir (docs/security.md). It is also the NATS login: user = its token id,
        password = the token, replies on `_INBOX.<token_id>` (docs/protocol.md, "Connecting"). `config`: what
        is not given comes from it instead of from the environment (ClientConfig.from_env())."""
        config = config or ClientConfig.from_env()
        url = url or config.find_nats_url()
        timeout = config.request_timeout_seconds if timeout is None else timeout
        token = token or config.find_token()
        nc = await open_nats(url, min(timeout, 2.0), token, config.nats_tls_ca)
        client = cls(nc, prefix or config.subject_prefix, timeout, actor=actor, token=token)
        client._owns = True
        return client

    async def close(self) -> None:
        """Drain the connection this client opened; one that is reconnecting (NATS cut it: a revoked token,
        a server restart) cannot drain, and is closed instead."""
        if self._owns:
            try:
                await self.nc.drain()
            except nats.errors.Error:
                try:
                    await self.nc.close()
                except asyncio.CancelledError:
                    # nats-py closing a connection the server is cutting can raise the cancel of its own
                    # transport's close waiter (seen once in a fresh-clone run, a token revoked mid-connect);
                    # only a cancel of this task is ours to pass on.
                    reraise_if_cancelled()

    async def __aenter__(self) -> MemoryClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def create_scope(self, scope_id: str, scope_kind: str = "workspace", **extra: Any) -> dict[str, Any]:
        return await self._command("create_scope", {"scope_id": scope_id, "scope_kind": scope_kind, **extra})

    async def create(self, scope_id: str, object_type: str, canonical_content: Any, actor: dict[str, Any],
                     provenance: dict[str, Any], **optional: Any) -> WriteResult:
        body = {"scope_id": scope_id, "object_type": object_type, "canonical_content": canonical_content,
                "actor": actor, "provenance": provenance, **optional}
        return cast(WriteResult, await self._command("create", body))

    async def update(self, scope_id: str, object_id: str, expected_version_id: str, canonical_content: Any,
                     actor: dict[str, Any], provenance: dict[str, Any], **optional: Any) -> WriteResult:
        body = {"scope_id": scope_id, "object_id": object_id, "expected_version_id": expected_version_id,
                "canonical_content": canonical_content, "actor": actor, "provenance": provenance, **optional}
        return cast(WriteResult, await self._command("update", body))

    async def transition(self, scope_id: str, object_id: str, expected_version_id: str, dimension: str,
                         target_state: str, actor: dict[str, Any], provenance: dict[str, Any],
                         **optional: Any) -> WriteResult:
        body = {"scope_id": scope_id, "object_id": object_id, "expected_version_id": expected_version_id,
                "dimension": dimension, "target_state": target_state, "actor": actor, "provenance": provenance,
                **optional}
        return cast(WriteResult, await self._command("transition", body))

    async def delete(self, scope_id: str, object_id: str, expected_version_id: str, actor: dict[str, Any],
                     provenance: dict[str, Any], **optional: Any) -> WriteResult:
        body = {"scope_id": scope_id, "object_id": object_id, "expected_version_id": expected_version_id,
                "actor": actor, "provenance": provenance, **optional}
        return cast(WriteResult, await self._command("delete", body))

    async def read(self, scope_id: str, object_id: str, version_id: str | None = None,
                   actor: dict[str, Any] | None = None, snapshot_id: str | None = None) -> MemoryEnvelope:
        """The object's envelope; at a sealed snapshot (`snapshot_id`): {envelope, snapshot}."""
        body: dict[str, Any] = {"scope_id": scope_id, "object_id": object_id}
        if version_id is not None:
            body["version_id"] = version_id
        if snapshot_id is not None:
            body["snapshot_id"] = snapshot_id
        return cast(MemoryEnvelope, await self.query_request("read", body, actor))

    async def history(self, scope_id: str, object_id: str, actor: dict[str, Any] | None = None,
                      snapshot_id: str | None = None) -> History:
        body: dict[str, Any] = {"scope_id": scope_id, "object_id": object_id}
        if snapshot_id is not None:
            body["snapshot_id"] = snapshot_id
        return cast(History, await self.query_request("history", body, actor))

    async def snapshot_create(self, scope_id: str, actor: dict[str, Any], at: int | None = None,
                              object_ids: list[str] | None = None, snapshot_id: str | None = None,
                              idempotency_key: str | None = None, **descriptor: Any) -> dict[str, Any]:
        """Seal an evaluation snapshot of the scope at ledger sequence `at` (default: the head), of
        `object_ids` (default: every object of the scope); `descriptor`: more fields of
        evaluation-snapshot.schema.json (evaluation_run_id, deterministic_clock, ...). Result: the sealed
        descriptor under `snapshot`, with the entry's `ledger_sequence` and `event_id`."""
        snapshot: dict[str, Any] = {"snapshot_id": snapshot_id or f"snap:{uuid.uuid4()}", **descriptor}
        if at is not None:
            snapshot["ledger_sequence_high_watermark"] = at
        if object_ids is not None:
            snapshot["included_object_ids"] = list(object_ids)
        body: dict[str, Any] = {"scope_id": scope_id, "actor": actor, "snapshot": snapshot}
        if idempotency_key is not None:
            body["idempotency_key"] = idempotency_key
        result = await self._command("snapshot_create", body)
        if "snapshot" not in result:  # a replayed result (a retry after a lost reply) names the entry only
            result = {**result, **await self.snapshot_show(scope_id, snapshot["snapshot_id"])}
        return result

    async def eval_start(self, scope_id: str, snapshot_id: str, actor: dict[str, Any],
                         evaluation_scope_id: str | None = None, evaluation_run_id: str | None = None,
                         idempotency_key: str | None = None, operation_id: str | None = None) -> dict[str, Any]:
        """Open an evaluation run forked from the sealed snapshot `snapshot_id` of `scope_id` into a new
        evaluation scope (default `eval:<run id>`; the run id: `evaluation_run_id`, else the snapshot's).
        Result: {ledger_sequence, event_id, evaluation_run: {scope_id, run_id, snapshot_id, base_scope_id,
        watermark, clock_start, tick_ms, seed}}."""
        if evaluation_scope_id is None:
            run_id = evaluation_run_id or (await self.snapshot_show(scope_id, snapshot_id))["snapshot"].get(
                "evaluation_run_id")
            if run_id is None:
                raise PamspecError.of("invalid_request", "the snapshot declares no evaluation_run_id: pass one"
                                      " (or an evaluation scope)", {"snapshot_id": snapshot_id,
                                                                    "field": "evaluation_run_id"})
            evaluation_scope_id = f"eval:{run_id}"
        body: dict[str, Any] = {"scope_id": scope_id, "actor": actor, "snapshot_id": snapshot_id,
                                "evaluation_scope_id": evaluation_scope_id}
        for name, value in (("evaluation_run_id", evaluation_run_id), ("idempotency_key", idempotency_key),
                            ("operation_id", operation_id)):
            if value is not None:
                body[name] = value
        return await self._command("eval_start", body)

    async def eval_end(self, evaluation_scope_id: str, actor: dict[str, Any], idempotency_key: str | None = None,
                       operation_id: str | None = None) -> dict[str, Any]:
        """Close the evaluation run of `evaluation_scope_id`: the scope stays readable, takes no more writes.
        (A scripted run that must give the same ledger twice passes its own operation ids: the SDK's are random.)"""
        body: dict[str, Any] = {"scope_id": evaluation_scope_id, "actor": actor}
        for name, value in (("idempotency_key", idempotency_key), ("operation_id", operation_id)):
            if value is not None:
                body[name] = value
        return await self._command("eval_end", body)

    async def snapshot_list(self, scope_id: str, after_sequence: int = 0, limit: int = 100,
                            actor: dict[str, Any] | None = None) -> dict[str, Any]:
        """The scope's sealed snapshots in sealing order: {snapshots: [{ledger_sequence, snapshot}], more}."""
        return await self.query_request("snapshots", {"scope_id": scope_id, "after_sequence": after_sequence,
                                                      "limit": limit}, actor)

    async def snapshot_show(self, scope_id: str, snapshot_id: str, actor: dict[str, Any] | None = None
                            ) -> dict[str, Any]:
        """One sealed snapshot's descriptor: {snapshot}."""
        return await self.query_request("snapshots", {"scope_id": scope_id, "snapshot_id": snapshot_id}, actor)

    async def snapshot_diff(self, scope_id: str, a: str, b: str, after_object_id: str | None = None,
                            limit: int = 100, actor: dict[str, Any] | None = None) -> dict[str, Any]:
        """What changed in the scope from sealed snapshot `a` to `b`, one page of objects in id order:
        {from, to, direction, added, removed, changed: [{object_id, from_version_id, to_version_id, versions,
        events, complete}], truncated, after_object_id}; while `truncated`, pass `after_object_id` back."""
        body: dict[str, Any] = {"scope_id": scope_id, "from_snapshot_id": a, "to_snapshot_id": b, "limit": limit}
        if after_object_id is not None:
            body["after_object_id"] = after_object_id
        return await self.query_request("snapshot_diff", body, actor)

    async def eval_diff(self, evaluation_scope_id: str, snapshot_id: str, after_object_id: str | None = None,
                        limit: int = 100, actor: dict[str, Any] | None = None) -> dict[str, Any]:
        """What the evaluation scope holds now against sealed snapshot `snapshot_id` of its run's base scope
        (typically the run's own): snapshot_diff's shape, `to` naming the evaluation scope and run."""
        body: dict[str, Any] = {"scope_id": evaluation_scope_id, "from_snapshot_id": snapshot_id, "limit": limit}
        if after_object_id is not None:
            body["after_object_id"] = after_object_id
        return await self.query_request("snapshot_diff", body, actor)

    async def query(self, scope_id: str, actor: dict[str, Any] | None = None, **filters: Any) -> QueryPage:
        """Query the scope (filters as in docs/protocol.md). Sends the last ledger sequence this client
        wrote as `min_sequence` unless given, so a client always sees its own writes."""
        return cast(QueryPage, await self.query_request("query", {"scope_id": scope_id, **filters}, actor))

    async def search(self, scope_id: str, text: str | None = None, vector: list[float] | None = None,
                     space: str | None = None, mode: str = "hybrid", filter: dict[str, Any] | None = None,
                     limit: int = 10, min_sequence: int | None = None, actor: dict[str, Any] | None = None,
                     wait_ms: int | None = None, snapshot_id: str | None = None) -> SearchPage:
        """Search the scope by text or vector in one Embedding Space (`space`; None = the default space).
        `filter` takes Query's structured filters (docs/protocol.md). Sends the last ledger sequence this
        client wrote as `min_sequence` unless given, so a search waits until its own writes are indexed.
        `snapshot_id`: the sealed snapshot's members at its watermark, in a space it names (or the default
        when it was sealed); the result carries its `snapshot` report."""
        body: dict[str, Any] = {"scope_id": scope_id, "mode": mode, "limit": limit, **(filter or {})}
        for name, value in (("text", text), ("vector", vector), ("embedding_space_id", space),
                            ("min_sequence", min_sequence), ("wait_ms", wait_ms), ("snapshot_id", snapshot_id)):
            if value is not None:
                body[name] = value
        return cast(SearchPage, await self.query_request("search", body, actor))

    async def events(self, scope_id: str, after_sequence: int = 0, limit: int = 100,
                     event_classes: list[str] | None = None, actor: dict[str, Any] | None = None) -> dict[str, Any]:
        """One page of the scope's ledger events after `after_sequence`, in ledger order (query.events, needs
        inspect_history): {scope_id, events: [{ledger_sequence, event}], last_sequence, more}. Pass
        `last_sequence` back as `after_sequence` for the next page."""
        body: dict[str, Any] = {"scope_id": scope_id, "after_sequence": after_sequence, "limit": limit}
        if event_classes is not None:
            body["event_classes"] = event_classes
        return await self.query_request("events", body, actor)

    async def query_request(self, name: str, body: dict[str, Any], actor: dict[str, Any] | None = None
                            ) -> dict[str, Any]:
        """Any query of docs/protocol.md by name (read, history, query, search, related, events, whoami) with its
        body as the NATS binding takes it. Query, search and related read what followers have applied, so they
        wait for this client's own writes (`min_sequence` = the last sequence it wrote) unless the body names
        `min_sequence`, `as_of_sequence` or `snapshot_id`. A body's `operation_id` also travels as the
        Pam-Operation-Id header (the id errors echo)."""
        return await self._request(*self._query(name, body, actor), retry=True)

    async def query_raw(self, name: str, body: dict[str, Any], actor: dict[str, Any] | None = None) -> msgspec.Raw:
        """query_request's result left encoded: for a caller that passes a large reply on as bytes (export's
        pages), so it is not decoded into Python objects first."""
        return cast(msgspec.Raw, await self._request(*self._query(name, body, actor), retry=True, decode=_result_raw))

    def _query(self, name: str, body: dict[str, Any], actor: dict[str, Any] | None
               ) -> tuple[str, dict[str, Any], dict[str, str]]:
        body = dict(body)
        if name in _SEES_OWN_WRITES and self.last_sequence and "min_sequence" not in body \
                and "as_of_sequence" not in body and "snapshot_id" not in body:
            body["min_sequence"] = self.last_sequence
        headers = self.actor_header(actor)
        if body.get("operation_id"):
            headers[OPERATION_HEADER] = str(body["operation_id"])
        return query_subject(self.prefix, name), body, headers

    async def subscribe(self, scope_id: str, actor: dict[str, Any], after_sequence: int | None = None,
                        filter: dict[str, Any] | None = None, delivery: dict[str, Any] | None = None,
                        subscription_id: str | None = None) -> Subscription:
        """Open (or, with subscription_id, re-attach to) a push subscription; iterate it for events."""
        delivery = {"keepalive_interval_ms": 2000, **(delivery or {}), "mode": "push"}
        # Listen on our own inbox first, then open (or resume) naming it: the first push cannot be missed. One
        # operation id for every retry: a retried open returns the subscription the first one made.
        inbox = self.nc.new_inbox()
        queue: asyncio.Queue[Any] = asyncio.Queue()
        listening = await self.nc.subscribe(inbox, cb=queue.put)
        body: dict[str, Any]
        if subscription_id is not None:  # re-attach, here: pushes come to this client's inbox from now on
            name, body = "resume", {"subscription_id": subscription_id, "after_sequence": after_sequence,
                                    "delivery_subject": inbox}
        else:
            name, body = "open", {"scope_id": scope_id, "actor": actor, "filter": filter or {},
                                  "delivery": {**delivery, "subject": inbox}, "operation_id": f"op:{uuid.uuid4()}"}
            if after_sequence is not None:
                body["after_sequence"] = after_sequence
        try:
            opened = await self.subscription_request(name, body, actor)
        except BaseException:
            await listening.unsubscribe()
            raise
        subscription = Subscription(self, opened, int(delivery["keepalive_interval_ms"]), actor)
        subscription.adopt(queue, listening)
        return subscription

    async def subscriptions(self, include_closed: bool = False, limit: int = 1000) -> list[dict[str, Any]]:
        """This client's own subscriptions (an administrator's token: everyone's), oldest first, at most
        `limit` (1..2000), open ones unless `include_closed`: each with its scope, owner, status, positions
        and times (`sub.list`; its `truncated` flag: `subscription_request("list", ...)`)."""
        listed = await self.subscription_request("list", {"all": include_closed, "limit": limit})
        return list(listed["subscriptions"])

    async def subscription_request(self, name: str, body: dict[str, Any],
                                   actor: dict[str, Any] | None = None) -> dict[str, Any]:
        """open | poll | ack | resume | close | status | list on the Subscribe gateway (docs/protocol.md)."""
        return await self._request(subscription_subject(self.prefix, name), body, self.actor_header(actor),
                                   retry=name != "poll")

    def actor_header(self, actor: dict[str, Any] | None) -> dict[str, str]:
        """The Pam-Actor header naming `actor` (else the client's own), or none: the caller is anonymous."""
        actor = actor or self.actor
        if not isinstance(actor, dict) or not actor:  # a malformed actor is the service's to refuse, in the body
            return {}
        named = {"actor_id": actor.get("actor_id"), "actor_kind": actor.get("actor_kind")}
        for optional in ("on_behalf_of_actor_id", "delegation_id"):  # a read under a delegation names it
            if actor.get(optional):
                named[optional] = actor[optional]
        return {ACTOR_HEADER: canonical_bytes(named).decode()}

    async def whoami(self, token: str | None = None) -> dict[str, Any]:
        """{actor_id, actor_kind, authenticated}: the actor this client's token (or `token`) proves (with auth
        off, whoever the Pam-Actor header names, else anonymous, and authenticated false)."""
        headers = self.actor_header(None)
        if token is not None:
            headers[AUTHORIZATION_HEADER] = f"Bearer {token}"
        return await self._request(query_subject(self.prefix, "whoami"), {}, headers, retry=True)

    async def me(self, fallback: dict[str, Any]) -> dict[str, Any]:
        """The actor to name in commands: the authenticated one, else `fallback` (auth off)."""
        found = await self.whoami()
        if found.get("authenticated"):
            return {"actor_id": found["actor_id"], "actor_kind": found["actor_kind"]}
        return fallback

    async def status(self, component: str = "writer") -> dict[str, Any]:
        return await self._request(status_subject(self.prefix, component), {}, {}, retry=False)

    async def command(self, name: str, body: dict[str, Any]) -> dict[str, Any]:
        """Any writer command by name (see docs/protocol.md), with retries and an idempotency key."""
        return await self._command(name, body)

    async def _command(self, name: str, body: dict[str, Any]) -> dict[str, Any]:
        operation_id = body.get("operation_id") or f"op:{uuid.uuid4()}"
        if (refused := refusal(body)) is not None:  # NaN/±Infinity would go out as null
            raise PamspecError.from_envelope({**refused, "operation_id": str(operation_id)})
        headers = {OPERATION_HEADER: operation_id,
                   **self.actor_header(self.actor or body.get("actor"))}  # the caller: this client, else the command's actor
        if name != "create_scope" and not body.get("idempotency_key"):
            headers["Pam-Idempotency-Key"] = f"sdk:{uuid.uuid4()}"
        result = await self._request(command_subject(self.prefix, name), body, headers, retry=True)
        # A command of several entries says where its last one is (`through_sequence`): read-your-writes waits for it.
        self.last_sequence = max(self.last_sequence, int(result.get("ledger_sequence", 0)),
                                 int(result.get("through_sequence", 0)))
        return result

    def request_headers(self, headers: dict[str, str]) -> dict[str, str]:
        """`headers` plus this client's credential (every request and the fire-and-forget acks carry it)."""
        if self.token is not None and AUTHORIZATION_HEADER not in headers:
            return {**headers, AUTHORIZATION_HEADER: f"Bearer {self.token}"}
        return headers

    async def _request(self, subject: str, body: dict[str, Any], headers: dict[str, str],
                       retry: bool, decode: Callable[[bytes], dict[str, Any]] = decode_json) -> dict[str, Any]:
        headers = self.request_headers(headers)
        payload = _encoder.encode(body)
        size = message_size(payload, headers)
        if size > self.nc.max_payload:
            raise _too_large(size, self.nc.max_payload)
        kind, _, name = subject.removeprefix(f"{self.prefix}.").rpartition(".")
        with request_span(kind, name, headers):  # a trace's first span, when the caller traces
            reply = await request_with_retries(self.nc, subject, payload, headers, self.timeout,
                                               self.retries if retry else 0, decode)
        if "result" in reply:
            return reply["result"]  # type: ignore[no-any-return]
        raise PamspecError.from_envelope(reply["error"])

    async def related(self, scope_id: str, object_id: str, relationship_types: list[str] | None = None,
                      direction: str = "both", hops: int = 1, limit: int = 50, actor: dict[str, Any] | None = None,
                      snapshot_id: str | None = None, **filters: Any) -> dict[str, Any]:
        """The relationships around `object_id` and the objects they reach, up to `hops` (1..3) steps
        (query.related, docs/protocol.md). Waits for this client's own writes like `query`. `snapshot_id`: the
        relationships between the sealed snapshot's members as they stood at its watermark."""
        body: dict[str, Any] = {"scope_id": scope_id, "from_object_id": object_id, "direction": direction,
                                "hops": hops, "limit": limit, **filters}
        if relationship_types is not None:
            body["relationship_types"] = relationship_types
        if snapshot_id is not None:
            body["snapshot_id"] = snapshot_id
        return await self.query_request("related", body, actor)

    async def read_with_relationship_refs(self, scope_id: str, object_id: str, version_id: str | None = None,
                                          actor: dict[str, Any] | None = None) -> dict[str, Any]:
        """Read, plus the non-authoritative relationship_refs beside the envelope: {envelope, relationship_refs,
        as_of_sequence}."""
        body: dict[str, Any] = {"scope_id": scope_id, "object_id": object_id, "include_relationship_refs": True}
        if version_id is not None:
            body["version_id"] = version_id
        return await self.query_request("read", body, actor)


class SyncMemoryClient:
    """Blocking wrapper around MemoryClient for scripts and notebooks (runs its own event loop)."""

    def __init__(self, url: str | None = None, prefix: str | None = None, timeout: float | None = None,
                 actor: dict[str, Any] | None = None, token: str | None = None):
        self._loop = asyncio.new_event_loop()
        try:
            self._client = self._loop.run_until_complete(MemoryClient.connect(url, prefix, timeout, actor, token))
        except BaseException:
            self._loop.close()
            raise

    def __getattr__(self, name: str) -> Any:
        method = getattr(self._client, name)

        def call(*args: Any, **kwargs: Any) -> Any:
            return self._loop.run_until_complete(method(*args, **kwargs))

        return call

    def subscribe(self, *args: Any, **kwargs: Any) -> SyncSubscription:
        """MemoryClient.subscribe, iterated with a plain `for`. Its acks and reconnects run while you
        are inside the iteration (this wrapper's event loop runs only inside its calls)."""
        return SyncSubscription(self._loop, self._loop.run_until_complete(self._client.subscribe(*args, **kwargs)))

    def close(self) -> None:
        self._loop.run_until_complete(self._client.close())
        self._loop.close()


class SyncSubscription:
    """A Subscription for blocking code: `for event in sub: ...`, then `sub.close()`."""

    def __init__(self, loop: asyncio.AbstractEventLoop, subscription: Any):
        self._loop = loop
        self._subscription = subscription
        self._events = subscription.__aiter__()
        self.subscription_id: str = subscription.subscription_id

    def __iter__(self) -> SyncSubscription:
        return self

    def __next__(self) -> dict[str, Any]:
        try:
            return self._loop.run_until_complete(self._events.__anext__())
        except StopAsyncIteration:
            raise StopIteration from None

    def close(self, reason: str = "unsubscribed") -> dict[str, Any]:
        self._loop.run_until_complete(self._events.aclose())
        return self._loop.run_until_complete(self._subscription.close(reason))
