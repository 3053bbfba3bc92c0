"""The indexer's outbox: ledger entries it owes (`embedding_generated`, `index_rebuilt`), written in the same
transaction as the vectors they describe and sent to the writer afterwards.

Why an outbox and not a request inside the follower's transaction: the follower must never wait on the
writer (the writer may be away; the indexer keeps indexing), and a crash between the vectors' COMMIT and the
request must not lose the entry. So the entry commits with the vectors; a sender sends it with a
deterministic idempotency key (a resend after a crash is a replay, never a second entry) and deletes it once
the writer answered. Several senders may run (FOR UPDATE SKIP LOCKED): each row is held by one at a time.

Why one entry per (scope, space, batch), not per vector: the ledger says which model embedded which
versions, at a cost of one small append per batch instead of one per object.
"""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import msgspec
import psycopg
import structlog

from infra.requester import CommandRequester
from schemas.canonical import canonical_bytes
from schemas.common import IDEMPOTENCY_KEY_MAX
from schemas.errors import PamledgerError

log = structlog.get_logger(__name__)

INDEXER_ACTOR = {"actor_id": "service:pamledger-indexer", "actor_kind": "service"}


@dataclass(frozen=True)
class Entry:
    scope_id: str
    event_type: str  # embedding_generated | index_rebuilt
    idempotency_key: str
    payload: dict[str, Any]


def entry_key(*parts: object) -> str:
    """A deterministic idempotency key from its parts; hashed when it would be too long (long scope ids)."""
    key = ":".join(str(p) for p in parts)
    if len(key) <= IDEMPOTENCY_KEY_MAX:
        return key
    return f"{parts[0]}:sha256:{hashlib.sha256(key.encode()).hexdigest()}"


async def add_entries(conn: psycopg.AsyncConnection[Any], entries: Sequence[Entry]) -> None:
    """Queue entries (inside the caller's transaction); a key already queued is left as it is."""
    if not entries:
        return
    await conn.execute(
        "INSERT INTO index_outbox (scope_id, event_type, idempotency_key, payload)"
        " SELECT * FROM unnest(%s::text[], %s::text[], %s::text[], %s::bytea[]) ON CONFLICT DO NOTHING",
        ([e.scope_id for e in entries], [e.event_type for e in entries], [e.idempotency_key for e in entries],
         [canonical_bytes(e.payload) for e in entries]))


_TAKE = ("SELECT outbox_id, scope_id, event_type, idempotency_key, payload FROM index_outbox"
         " ORDER BY outbox_id LIMIT %s FOR UPDATE SKIP LOCKED")


async def send_some(conn: psycopg.AsyncConnection[Any], requester: CommandRequester, limit: int) -> int:
    """Send up to `limit` queued entries, oldest first, deleting each the writer answered; returns how many
    were done. A rejection (a non-retryable error: the scope is gone, say) is logged and dropped, so one bad
    entry never blocks the rest; an unavailable writer raises and the rows stay for the next pass."""
    done = 0
    async with conn.transaction():
        cur = await conn.execute(_TAKE, (limit,))
        for outbox_id, scope_id, event_type, key, payload in await cur.fetchall():
            body = {"scope_id": scope_id, "event_type": event_type, "actor": INDEXER_ACTOR,
                    "payload": msgspec.json.decode(bytes(payload)), "idempotency_key": key}
            try:
                await requester.command("record_index_event", body)
            except PamledgerError as exc:
                if exc.retryable or exc.code in ("service_unavailable", "internal_error"):
                    raise
                log.error("indexer.outbox_entry_rejected", scope_id=scope_id, idempotency_key=key, code=exc.code,
                          reason=exc.message)
            await conn.execute("DELETE FROM index_outbox WHERE outbox_id = %s", (outbox_id,))
            done += 1
    return done


async def send_forever(database_url: str, requester: CommandRequester, batch: int, poll_seconds: float,
                       retry_max_seconds: float) -> None:
    """Drain the outbox forever: at once while there is work, every `poll_seconds` when idle, backing off
    (doubling up to `retry_max_seconds`) while the writer or Postgres is away."""
    delay = poll_seconds
    waiting = False  # said once when sending starts failing and once when it works again, not per retry
    while True:
        try:
            async with await psycopg.AsyncConnection.connect(database_url, autocommit=True) as conn:
                while True:
                    sent = await send_some(conn, requester, batch)
                    if waiting and sent:
                        log.info("indexer.outbox_sending")
                        waiting = False
                    delay = poll_seconds
                    if sent < batch:
                        await asyncio.sleep(poll_seconds)
        except Exception as exc:  # noqa: BLE001 - writer away, NATS or Postgres down: wait and go on
            (log.debug if waiting else log.warning)("indexer.outbox_waiting", error=type(exc).__name__,
                                                    retry_in_seconds=round(delay, 2))
            waiting = True
            await asyncio.sleep(delay)
            delay = min(retry_max_seconds, delay * 2)
