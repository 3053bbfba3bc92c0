"""The read side as a NATS service in a queue group: Read, Inspect History, Query, Search and Related.

Each request is answered in its own task, so a query that waits for the projection (`min_sequence`, up to
`wait_ms`) or a slow full-text query never holds up the others; the connection pool bounds how many reach
Postgres at once. Past `query.max_in_flight` requests in one process (infra.settings), new ones are refused
at once with `service_unavailable` (retryable) rather than queued without bound. Each admitted request
runs through the kernel's request shell (infra.request_shell): actor header, policy, one error mapping.
"""

from __future__ import annotations

import asyncio
import os
import time
from typing import Annotated, Any

import msgspec
import structlog
from nats.aio.msg import Msg
from psycopg_pool import AsyncConnectionPool

from embedding.store import INDEX_CHECKPOINT, INDEX_NOTIFY_CHANNEL
from infra.metrics import QUERY_SECONDS, query_label
from infra.nats_raw import RawClient, parse_headers
from infra.request_shell import DelegationGate, DenialSink, Policy, RequestContext, RequestShell
from infra.settings import QuerySettings
from infra.status import status_reply
from pamledger_client.protocol.subjects import QUERIES, query_subject, status_subject
from query.export import ExportRequest, export_entries, export_header
from query.reads import history, read_envelope, scope_events
from query.related import relationship_refs, run_related
from query.snapshot_diff import SnapshotDiffRequest, snapshot_diff
from query.snapshots import SealedSnapshots, SnapshotsRequest, pin_report, pinned, snapshots
from query.eval_diff import evaluation_diff
from query.evaluation import Forks, fork_of
from query.hybrid import run_search
from query.snapshot_search import run_search_at_snapshot
from query.related_snapshot import run_related_at_snapshot
from query.connections import Connections
from query.cursor_keys import CursorSigner, caller_tag
from query.replicas import ReplicaReads
from query.partitions import ScopePositions
from query.search import CheckpointWatcher, run_query
from schemas.queries import RelatedRequest, decode_query, decode_related, decode_request
from schemas.search import SearchRequest, decode_search
from schemas.canonical import canonical_bytes
from schemas.common import Id
from schemas.errors import InvalidRequest, ObjectNotFound, ServiceUnavailable
from schemas.replies import OPERATION_HEADER, error_reply

log = structlog.get_logger(__name__)


class ReadRequest(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    scope_id: Id
    object_id: Id
    version_id: Id | None = None
    # The non-authoritative relationship_refs projection, beside the envelope (never in it: the envelope's
    # bytes stay those of the committed version): result {envelope, relationship_refs, as_of_sequence}.
    include_relationship_refs: bool = False
    snapshot_id: Id | None = None  # as the sealed snapshot holds it: result {envelope, snapshot}
    operation_id: Annotated[str, msgspec.Meta(max_length=512)] | None = None


class WhoamiRequest(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Who the service takes the caller to be (the actor its credential proves)."""

    operation_id: Annotated[str, msgspec.Meta(max_length=512)] | None = None


class HistoryRequest(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    scope_id: Id
    object_id: Id
    snapshot_id: Id | None = None  # the versions and events up to the sealed snapshot's watermark
    operation_id: Annotated[str, msgspec.Meta(max_length=512)] | None = None


class EventsRequest(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """A scope's ledger events after a position (Inspect History of the whole scope), one page at a time."""

    scope_id: Id
    after_sequence: Annotated[int, msgspec.Meta(ge=0, le=2**63 - 1)] = 0  # a Postgres bigint
    limit: Annotated[int, msgspec.Meta(ge=1, le=1000)] = 100
    event_classes: Annotated[list[Annotated[str, msgspec.Meta(max_length=64)]],
                             msgspec.Meta(min_length=1, max_length=64)] | None = None
    operation_id: Annotated[str, msgspec.Meta(max_length=512)] | None = None


_read_decoder = msgspec.json.Decoder(ReadRequest)
_events_decoder = msgspec.json.Decoder(EventsRequest)
_history_decoder = msgspec.json.Decoder(HistoryRequest)
_whoami_decoder = msgspec.json.Decoder(WhoamiRequest)
_export_decoder = msgspec.json.Decoder(ExportRequest)
_snapshots_decoder = msgspec.json.Decoder(SnapshotsRequest)
_snapshot_diff_decoder = msgspec.json.Decoder(SnapshotDiffRequest)


class QueryService:
    """Answers read/history/query/search requests from any number of instances (queue group `pamledger-query`)."""

    def __init__(self, nc: RawClient, pool: AsyncConnectionPool[Any], prefix: str, watcher: CheckpointWatcher,
                 settings: QuerySettings, partition: int, policy: Policy | None = None,
                 index_watcher: CheckpointWatcher | None = None, denials: DenialSink | None = None,
                 delegations: DelegationGate | None = None, signer: CursorSigner | None = None,
                 replicas: ReplicaReads | None = None, positions: ScopePositions | None = None):
        """`watcher` follows the projection (Query, lexical search), `index_watcher` the indexer (semantic
        search); without one, a search's min_sequence on the index is never reached and says so. `replicas`:
        where scans read when read replicas are configured (query.replicas); read and history, lookups by
        key, stay on the primary (on a replica they would cost the primary its fence statement anyway)."""
        self.nc = nc
        # denials: where refusals are recorded; delegations: reads under a delegation (both where auth is on)
        self.shell = RequestShell(policy, denials=denials, delegations=delegations)
        self.partition = partition
        self.settings = settings
        self.pool = pool
        self.replicas = replicas
        self.scans: Connections = replicas if replicas is not None else pool
        self.forks = Forks()  # which scopes are evaluation scopes (query.evaluation)
        self.prefix = prefix
        self.watcher = watcher
        self.index_watcher = index_watcher or CheckpointWatcher(INDEX_CHECKPOINT, INDEX_NOTIFY_CHANNEL)
        # Each scope's partition and its checkpoints' watchers (query.partitions); one partition: the above.
        self.positions = positions or ScopePositions.single(partition, self.watcher, self.index_watcher)
        self._subs: list[Any] = []
        self._in_flight: set[asyncio.Task[None]] = set()
        # Signs query cursors (query.cursor_keys); the composition root gives the state dir's keys.
        self.signer = signer or CursorSigner(None, settings.cursor_key_grace_seconds)
        self.sealed = SealedSnapshots()  # sealed snapshots found, by id (they never change)

    async def start(self) -> None:
        for name in QUERIES:
            self._subs.append(await self.nc.subscribe_raw(
                query_subject(self.prefix, name), self._on_request, queue="pamledger-query"))
        self._subs.append(await self.nc.subscribe(
            status_subject(self.prefix, "query"), queue="pamledger-query", cb=self._status))
        await self.nc.flush()
        log.info("query.serving")

    async def stop(self) -> None:
        """Take no more requests; let those in flight finish (briefly), then cancel the rest."""
        for sub in self._subs:
            await self.nc.unsubscribe_raw(sub)
        if self._in_flight:
            _, late = await asyncio.wait(set(self._in_flight), timeout=self.settings.stop_grace_seconds)
            for task in late:
                task.cancel()
            if late:
                await asyncio.wait(late)

    async def _status(self, msg: Msg) -> None:
        await msg.respond(status_reply(self.shell.policy, msg.subject, msg.headers,
                                       {"role": "query", "leader": False, "ok": True}, self._details))

    def _details(self) -> dict[str, Any]:
        """The administrator's part of status: the pid, and with read replicas where scans read and why."""
        details: dict[str, Any] = {"pid": os.getpid()}
        if self.replicas is not None:
            details["database"] = self.replicas.status()
        return details

    def _on_request(self, subject: bytes, reply: bytes, data: bytes, headers: bytes | None) -> None:
        task = asyncio.create_task(self._handle(subject.decode(), reply.decode(), data, headers))
        self._in_flight.add(task)
        task.add_done_callback(self._in_flight.discard)

    async def _handle(self, subject: str, reply: str, data: bytes, headers: bytes | None) -> None:
        started = time.perf_counter()
        name = subject.rsplit(".", 1)[-1]
        fields = parse_headers(headers)
        limit = self.settings.max_in_flight
        if len(self._in_flight) > limit:
            busy = ServiceUnavailable("too many requests in flight; retry", details={"limit": limit})
            body = error_reply(busy, (fields or {}).get(OPERATION_HEADER))
        else:
            body = await self.shell.answer(f"query.{name}", subject, data, fields,
                                           lambda raw: self._decode(name, raw), self._answer)
        if reply:
            await self.nc.publish(reply, body)
        QUERY_SECONDS.labels(query_label(name), "error" if body.startswith(b'{"error"') else "ok").observe(
            time.perf_counter() - started)

    def _decode(self, name: str, data: bytes) -> Any:
        limit = self.settings.max_request_bytes
        if len(data) > limit:
            raise InvalidRequest("query payload too large", details={"limit_bytes": limit})
        try:
            if name == "read":
                return _read_decoder.decode(data)
            if name == "history":
                return _history_decoder.decode(data)
            if name == "query":
                return decode_query(data)
            if name == "search":
                return decode_search(data)
            if name == "whoami":
                return _whoami_decoder.decode(data)
            if name == "related":
                return decode_related(data)
            if name == "events":
                return decode_request(_events_decoder, data, "events request")
            if name == "export":
                return decode_request(_export_decoder, data, "export request")
            if name == "snapshots":
                return decode_request(_snapshots_decoder, data, "snapshots request")
            if name == "snapshot_diff":
                return decode_request(_snapshot_diff_decoder, data, "snapshot_diff request")
        except (msgspec.DecodeError, msgspec.ValidationError) as exc:
            raise InvalidRequest(f"malformed {name} request: {exc}", details={"reason": str(exc)}) from None
        raise InvalidRequest(f"unknown query {name!r}")

    def _may_read(self, context: RequestContext, scope_id: str) -> bool:
        """May the caller read `scope_id` (a step of a traversal into another scope)? Auth off: yes. Enforced:
        only by the caller's own grants (the policy's `holds`), never under a delegation (it covers one
        scope), never for an unauthenticated caller."""
        policy = self.shell.policy
        if not policy.enforced:
            return True
        if not context.authenticated or context.principal.delegation_id is not None:
            return False
        return policy.holds(context.principal.actor_id, scope_id, "read")

    def _grants_of(self, context: RequestContext) -> list[dict[str, list[str]]] | None:
        """The caller's own grants (what the MCP manifest shows it may do); None where auth is off (no
        grant is checked), [] for a caller the policy cannot say anything about."""
        policy = self.shell.policy
        if not policy.enforced:
            return None
        if not context.authenticated:
            return []
        return policy.grants_of(context.principal.actor_id)

    async def _answer(self, request: Any, context: RequestContext) -> bytes:
        if isinstance(request, WhoamiRequest):
            return canonical_bytes({"result": {"actor_id": context.principal.actor_id,
                                               "actor_kind": context.principal.actor_kind,
                                               "authenticated": context.authenticated,
                                               "grants": self._grants_of(context)}})
        if isinstance(request, (ReadRequest, HistoryRequest)) and request.snapshot_id is not None:
            return await self._at_snapshot(request)
        if isinstance(request, SnapshotsRequest):
            async with self.scans.connection() as conn:
                return await snapshots(conn, request)
        if isinstance(request, SnapshotDiffRequest):
            async with self.scans.connection() as conn:
                if request.to_snapshot_id is None:  # a snapshot against an evaluation scope
                    return await evaluation_diff(conn, request)
                return await snapshot_diff(conn, request)
        if isinstance(request, ReadRequest):
            async with self.pool.connection() as conn:
                try:
                    envelope = await read_envelope(conn, request.scope_id, request.object_id, request.version_id)
                except ObjectNotFound:  # an evaluation scope reads its snapshot's objects it has not written
                    fork = await fork_of(conn, request.scope_id, request.object_id)
                    if fork is None:
                        raise
                    envelope = await read_envelope(conn, fork[0], request.object_id, request.version_id,
                                                   fork[1].watermark)
            if request.include_relationship_refs:
                refs, at = await relationship_refs(self.pool, request.scope_id, request.object_id)
                return canonical_bytes({"result": {"envelope": msgspec.Raw(envelope), "relationship_refs": refs,
                                                   "as_of_sequence": at}})
            return canonical_bytes({"result": msgspec.Raw(envelope)})
        if isinstance(request, HistoryRequest):
            async with self.pool.connection() as conn:
                try:
                    return await history(conn, request.scope_id, request.object_id)
                except ObjectNotFound:  # as for read: the snapshot's history of an object the run has not written
                    fork = await fork_of(conn, request.scope_id, request.object_id)
                    if fork is None:
                        raise
                    return await history(conn, fork[0], request.object_id, fork[1].watermark)
        where = await self.positions.of(self.pool, request.scope_id)  # its partition and that one's checkpoints
        request = await self.positions.reachable(self.pool, where, request)
        if isinstance(request, EventsRequest):
            async with self.scans.connection() as conn:
                return await scope_events(conn, request.scope_id, where.partition, request.after_sequence,
                                          request.limit, request.event_classes)
        if isinstance(request, ExportRequest):
            async with self.scans.connection() as conn:
                if request.part == "header":
                    return await export_header(conn, request, where.partition)
                return await export_entries(conn, request, where.partition)
        if isinstance(request, SearchRequest) and request.snapshot_id is not None:
            return await run_search_at_snapshot(self.scans, where.watcher, where.index_watcher, request, self.sealed)
        if isinstance(request, SearchRequest):
            forked = await self.forks.of(self.scans, request.scope_id)  # an evaluation scope reads its snapshot too
            return await run_search(self.scans, where.watcher, where.index_watcher, request, self.settings, forked)
        if isinstance(request, RelatedRequest) and request.snapshot_id is not None:
            return await run_related_at_snapshot(self.scans, request, lambda scope: self._may_read(context, scope),
                                                 self.sealed)
        if isinstance(request, RelatedRequest):
            return await run_related(self.scans, where.watcher, request, lambda scope: self._may_read(context, scope))
        principal = context.principal
        caller = caller_tag(principal.actor_id, principal.delegation_id)
        source = None
        if request.snapshot_id is None and request.as_of_sequence is None:  # an evaluation scope reads its fork
            source = await self.forks.of(self.scans, request.scope_id)
        return await run_query(self.scans, where.watcher, request, where.partition, self.signer, caller, source,
                               self.sealed)

    async def _at_snapshot(self, request: ReadRequest | HistoryRequest) -> bytes:
        """Read or history as a sealed snapshot holds the object: at its watermark, members only."""
        assert request.snapshot_id is not None
        if isinstance(request, ReadRequest) and request.include_relationship_refs:
            raise InvalidRequest("relationship_refs are the current projection's: not at a snapshot",
                                 details={"field": "include_relationship_refs"})
        pin = await self.sealed.pin(self.pool, request.scope_id, request.snapshot_id)
        async with self.pool.connection() as conn:
            if not pin.holds(request.object_id):
                raise ObjectNotFound("object not found in this snapshot", details={"object_id": request.object_id})
            report = await pin_report(conn, pin)
            if isinstance(request, HistoryRequest):
                return await history(conn, request.scope_id, request.object_id, pin.watermark, {"snapshot": report})
            envelope = await read_envelope(conn, request.scope_id, request.object_id, request.version_id,
                                           pin.watermark)
        return canonical_bytes({"result": {"envelope": msgspec.Raw(envelope), "snapshot": report}})
