"""The read side as a NATS service in a queue group: Read, Inspect History and Query."""

from __future__ import annotations

from typing import Annotated, Any

import msgspec
from nats.aio.client import Client as NATS
import psycopg
import structlog
from nats.aio.msg import Msg
from psycopg_pool import AsyncConnectionPool

from command_handler.intake import error_reply
from infra.db_errors import map_db_error
from infra.subjects import QUERIES, query_subject, status_subject
from query.reads import history, read_envelope
from query.request import decode_query
from query.search import CheckpointWatcher, run_query
from schemas.canonical import canonical_bytes
from schemas.common import Id
from schemas.errors import InvalidRequest, PamledgerError

log = structlog.get_logger(__name__)
MAX_QUERY_BYTES = 65_536


class ReadRequest(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    scope_id: Id
    object_id: Id
    version_id: Id | None = None
    operation_id: Annotated[str, msgspec.Meta(max_length=512)] | None = None


class HistoryRequest(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    scope_id: Id
    object_id: Id
    operation_id: Annotated[str, msgspec.Meta(max_length=512)] | None = None


_read_decoder = msgspec.json.Decoder(ReadRequest)
_history_decoder = msgspec.json.Decoder(HistoryRequest)


class QueryService:
    """Answers read/history/query requests from any number of instances (queue group `pamledger-query`)."""

    def __init__(self, nc: NATS, pool: AsyncConnectionPool[Any], prefix: str, watcher: CheckpointWatcher):
        self.nc = nc
        self.pool = pool
        self.prefix = prefix
        self.watcher = watcher
        self._subs: list[Any] = []

    async def start(self) -> None:
        for name in QUERIES:
            self._subs.append(await self.nc.subscribe(
                query_subject(self.prefix, name), queue="pamledger-query", cb=self._handle))
        self._subs.append(await self.nc.subscribe(
            status_subject(self.prefix, "query"), queue="pamledger-query", cb=self._status))
        await self.nc.flush()
        log.info("query.serving")

    async def stop(self) -> None:
        for sub in self._subs:
            await sub.unsubscribe()

    async def _status(self, msg: Msg) -> None:
        await msg.respond(canonical_bytes({"result": {"role": "query", "ok": True}}))

    async def _handle(self, msg: Msg) -> None:
        name = msg.subject.rsplit(".", 1)[-1]
        operation_id = (msg.headers or {}).get("Pam-Operation-Id")
        try:
            body = await self._answer(name, msg.data)
        except PamledgerError as exc:
            body = error_reply(exc, operation_id)
        except psycopg.Error as exc:
            log.error("query.failed", error=type(exc).__name__, query=name)
            body = error_reply(map_db_error(exc), operation_id)
        if msg.reply:
            await msg.respond(body)

    async def _answer(self, name: str, data: bytes) -> bytes:
        if len(data) > MAX_QUERY_BYTES:
            raise InvalidRequest("query payload too large", details={"limit_bytes": MAX_QUERY_BYTES})
        try:
            if name == "read":
                req = _read_decoder.decode(data)
                async with self.pool.connection() as conn:
                    envelope = await read_envelope(conn, req.scope_id, req.object_id, req.version_id)
                return canonical_bytes({"result": msgspec.Raw(envelope)})
            if name == "history":
                hreq = _history_decoder.decode(data)
                async with self.pool.connection() as conn:
                    return await history(conn, hreq.scope_id, hreq.object_id)
            if name == "query":
                return await run_query(self.pool, self.watcher, decode_query(data))
        except (msgspec.DecodeError, msgspec.ValidationError) as exc:
            raise InvalidRequest(f"malformed {name} request: {exc}", details={"reason": str(exc)}) from None
        raise InvalidRequest(f"unknown query {name!r}")
