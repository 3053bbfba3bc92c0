"""Baseline (b): a naive writer of the same shape as pamledger's, minus group commit.

    python -m bench.naive NATS_URL DATABASE_URL SUBJECT

It decodes the same create command with the same msgspec Structs (command_handler.core.intake.parse over
schemas.commands.CreateObject), decides it with the same pure core, chains the same row hash, and for
each command, in arrival order, opens ONE transaction that inserts the same rows (ledger row,
memory_versions row, content_store row, idempotency record), commits, and only then replies with the
same result bytes. No batching: one transaction and one fsync per command.

To keep the baseline strong it skips the idempotency pre-read and relies on the primary key of
idempotency_records instead (a duplicate key makes the transaction fail and the reply an error), and it
caches known scopes in memory. `SUBJECT.ping` answers for readiness.
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import uuid
from datetime import datetime, timezone
from typing import Any

import nats
import psycopg
from nats.aio.msg import Msg

from command_handler.core.chain import row_hash
from command_handler.core.decide import decide
from command_handler.core.intake import Parsed, parse
from command_handler.core.state import Stamp
from command_handler.store import PostgresLedgerStore
from infra.db_errors import map_db_error
from schemas.replies import error_reply, result_bytes
from schemas.canonical import canonical_bytes
from schemas.commands import CreateObject
from schemas.errors import PamledgerError, ScopeNotFound
from schemas.registry import default_registry

INSERT_LEDGER = (
    "INSERT INTO ledger (partition, ledger_sequence, event_id, operation_id, scope_id, object_id, version_id,"
    " event_type, recorded_at, event, prev_hash, row_hash) VALUES (0, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s)"
)
INSERT_VERSION = (
    "INSERT INTO memory_versions (scope_id, object_id, sequence, version_id, ledger_sequence, meta,"
    " content_digest) VALUES (%s, %s, %s, %s, %s, %s, %s)"
)
INSERT_CONTENT = (
    "INSERT INTO content_store (content_digest, scope_id, object_id, salt, content) VALUES (%s, %s, %s, %s, %s)"
)
INSERT_IDEMPOTENCY = (
    "INSERT INTO idempotency_records (scope_id, idempotency_key, request_digest, object_id, version_id,"
    " ledger_sequence) VALUES (%s, %s, %s, %s, %s, %s)"
)
MAX_PAYLOAD = 1_048_576


class NaiveWriter:
    """One command, one transaction; the tail (sequence, hash) moves only after COMMIT."""

    def __init__(self, conn: psycopg.AsyncConnection[Any]):
        self.conn = conn
        self.tail: tuple[int, bytes] = (0, b"")
        self.scopes: set[str] = set()
        self.registry = default_registry()

    async def start(self) -> None:
        self.tail = await PostgresLedgerStore(self.conn).tail()

    async def handle(self, msg: Msg) -> bytes:
        operation_id = (msg.headers or {}).get("Pam-Operation-Id")
        try:
            parsed = parse("create", msg.data, msg.headers, MAX_PAYLOAD)
            return await self._create(parsed)
        except PamledgerError as exc:
            return error_reply(exc, operation_id)
        except psycopg.Error as exc:
            return error_reply(map_db_error(exc), operation_id)

    async def _create(self, parsed: Parsed) -> bytes:
        command = parsed.command
        assert isinstance(command, CreateObject)
        await self._require_scope(command.scope_id)
        stamp = _stamp(parsed)
        decision = decide(None, command, stamp, self.registry)
        head, event = decision.head, decision.event
        assert head is not None, "a create always commits a version"
        seq, prev = self.tail[0] + 1, self.tail[1]
        event_bytes = canonical_bytes(event)
        new_hash = row_hash(prev, seq, event_bytes)
        async with self.conn.transaction():
            await self.conn.execute(INSERT_LEDGER, (
                seq, event.event_id, event.operation_id, event.scope_id, event.object_id, event.version_id,
                event.event_type, event.recorded_at, event_bytes, prev, new_hash))
            await self.conn.execute(INSERT_VERSION, (
                head.scope_id, head.object_id, head.sequence, head.version_id, seq, canonical_bytes(head.meta),
                head.content_digest))
            await self.conn.execute(INSERT_CONTENT, (
                head.content_digest, head.scope_id, head.object_id, stamp.salt, decision.content))
            if parsed.idempotency_key is not None:
                await self.conn.execute(INSERT_IDEMPOTENCY, (
                    head.scope_id, parsed.idempotency_key, parsed.request_digest, head.object_id,
                    head.version_id, seq))
        self.tail = (seq, new_hash)
        return result_bytes(head, seq, event.event_id, decision.content)

    async def _require_scope(self, scope_id: str) -> None:
        if scope_id in self.scopes:
            return
        cur = await self.conn.execute("SELECT 1 FROM scopes WHERE scope_id = %s", (scope_id,))
        if await cur.fetchone() is None:
            raise ScopeNotFound("scope not found", details={"scope_id": scope_id})
        self.scopes.add(scope_id)


def _stamp(parsed: Parsed) -> Stamp:
    return Stamp(
        operation_id=parsed.operation_id or f"op:{uuid.uuid4()}", event_id=f"evt:{uuid.uuid4()}",
        version_id=f"ver:{uuid.uuid4()}", object_id=f"mem:{uuid.uuid4()}", now=datetime.now(timezone.utc),
        salt=os.urandom(16),
    )


async def serve(nats_url: str, database_url: str, subject: str) -> None:
    nc = await nats.connect(nats_url, name="bench-naive", pending_size=64 * 1024 * 1024)
    conn = await psycopg.AsyncConnection.connect(database_url, autocommit=True)
    writer = NaiveWriter(conn)
    await writer.start()
    inbox: asyncio.Queue[Msg] = asyncio.Queue()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)

    async def ping(msg: Msg) -> None:
        await msg.respond(b'{"result":{"ready":true}}')

    await nc.subscribe(subject, cb=inbox.put, pending_msgs_limit=1_000_000, pending_bytes_limit=1 << 30)
    await nc.subscribe(subject + ".ping", cb=ping)
    await nc.flush()

    async def consume() -> None:
        while True:
            msg = await inbox.get()
            body = await writer.handle(msg)
            if msg.reply:
                await nc.publish(msg.reply, body)

    task = asyncio.create_task(consume())
    await stop.wait()
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    await nc.drain()
    await conn.close()


def main() -> int:
    nats_url, database_url, subject = sys.argv[1], sys.argv[2], sys.argv[3]
    asyncio.run(serve(nats_url, database_url, subject))
    return 0


if __name__ == "__main__":
    sys.exit(main())
