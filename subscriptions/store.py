"""The gateway's Postgres side: the `subscriptions` table, the ledger head, and the leader's connection.

Why one adapter: the gateway's SQL lives beside the code that runs it, and the connection is the
leader's (its advisory lock lives on that database session). A lost connection is noticed by `check`
within seconds, not on the next write; `reconnect` takes the lock again on a new session and goes on
only if nobody led the partition meanwhile, so the open subscriptions keep their in-memory positions
(delivery stays exactly once across a Postgres restart).
"""

from __future__ import annotations

import asyncio
from datetime import datetime
from typing import Any

import psycopg
import structlog

from infra.ledger import HEAD, ledger_head
from infra.ledger_identity import REBUILD_STREAM, Disagreement, ledger_identity
from infra.scopes import SCOPE_EXISTS

log = structlog.get_logger(__name__)
LOST_CONNECTION = (psycopg.OperationalError, psycopg.InterfaceError)

# A subscription carries its partition and that partition's ledger id (the column's default is partition 0's).
INSERT_SQL = (
    "INSERT INTO subscriptions (subscription_id, scope_id, request, start_sequence, acked_sequence, operation_id,"
    " credential_id, partition, ledger_id) VALUES (%s, %s, %s, %s, %s, %s, %s, %s, pamledger_ledger_id(%s))")
REBIND_SQL = "UPDATE subscriptions SET request = %s, credential_id = %s WHERE subscription_id = %s AND status = 'open'"
OPENED_BY_SQL = "SELECT subscription_id, request, start_sequence FROM subscriptions WHERE operation_id = %s"
HEAD_OF_SQL = f"SELECT {SCOPE_EXISTS}, {HEAD}"
POSITIONS_SQL = (
    "UPDATE subscriptions AS s SET acked_sequence = v.acked, last_delivered_sequence = v.delivered"
    " FROM unnest(%s::text[], %s::bigint[], %s::bigint[]) AS v(id, acked, delivered)"
    " WHERE s.subscription_id = v.id AND s.status = 'open'")
CLOSING_SQL = (
    "UPDATE subscriptions SET status = 'closing', close_reason = %s, last_delivered_sequence = %s,"
    " acked_sequence = %s, closed_at = now() WHERE subscription_id = %s")
CLOSED_SQL = "UPDATE subscriptions SET status = 'closed' WHERE subscription_id = %s AND status = 'closing'"
OPEN_ROWS_SQL = (
    "SELECT subscription_id, request, coalesce(acked_sequence, start_sequence), credential_id FROM subscriptions"
    " WHERE status = 'open' AND partition = %s")
CLOSING_ROWS_SQL = (
    "SELECT subscription_id, request, close_reason, last_delivered_sequence FROM subscriptions"
    " WHERE status = 'closing' AND partition = %s")
PARTITION_OF_SQL = "SELECT partition FROM subscriptions WHERE subscription_id = %s"
ENDED_SQL = (
    "SELECT coalesce(last_delivered_sequence, acked_sequence, start_sequence) FROM subscriptions"
    " WHERE subscription_id = %s AND status IN ('closing', 'closed')")
# Who opened a subscription: the actor of its stored request (what _check_owner and sub.list both go by).
_OWNER = "convert_from(request, 'UTF8')::jsonb -> 'actor' ->> 'actor_id'"
OWNER_SQL = f"SELECT {_OWNER} FROM subscriptions WHERE subscription_id = %s"
LIST_SQL = (
    f"SELECT * FROM (SELECT subscription_id, scope_id, {_OWNER} AS actor_id, status, close_reason,"
    " start_sequence, last_delivered_sequence, acked_sequence, created_at, closed_at FROM subscriptions"
    " WHERE %(all)s OR status = 'open') s"
    " WHERE %(actor)s::text IS NULL OR s.actor_id = %(actor)s ORDER BY created_at, subscription_id"
    " LIMIT %(limit)s")
LIST_COLUMNS = ("subscription_id", "scope_id", "actor_id", "status", "close_reason", "start_sequence",
                "last_delivered_sequence", "acknowledged_sequence", "created_at", "closed_at")
OPEN_POSITIONS_SQL = (
    "SELECT subscription_id, acked_sequence FROM subscriptions WHERE status = 'open' AND partition = %s")
# The delegations open subscriptions run under, still live: not revoked, and not past their not_after.
LIVE_DELEGATIONS_SQL = (
    "SELECT delegation_id FROM delegations WHERE delegation_id = ANY(%s) AND NOT revoked"
    " AND coalesce((convert_from(grant_object, 'UTF8')::jsonb ->> 'not_after')::timestamptz > now(), true)")


class LeadershipLost(Exception):
    """The database came back but this gateway may not go on leading: start over as a standby."""


class SubscriptionStore:
    """The leader's connection and every statement the gateway runs on it."""

    def __init__(self, conn: psycopg.AsyncConnection[Any], database_url: str, lock_key: int, partition: int,
                 retry_seconds: float = 0.5):
        self.conn = conn
        self.partition = partition
        self.database_url = database_url
        self.lock_key = lock_key
        self.retry_seconds = retry_seconds
        self._replaced: list[psycopg.AsyncConnection[Any]] = []

    async def insert(self, subscription_id: str, scope_id: str, request: bytes, start: int,
                     operation_id: str | None, credential_id: str | None = None) -> None:
        await self.conn.execute(INSERT_SQL, (subscription_id, scope_id, request, start, start, operation_id,
                                             credential_id, self.partition, self.partition))

    async def live_delegations(self, delegation_ids: list[str]) -> set[str]:
        """Which of these delegations still hold (neither revoked nor expired)."""
        cur = await self.conn.execute(LIVE_DELEGATIONS_SQL, (delegation_ids,))
        return {str(r[0]) for r in await cur.fetchall()}

    async def rebind(self, subscription_id: str, request: bytes, credential_id: str | None) -> None:
        """A resume by another token: the request (its delivery subject) and the credential it goes on under."""
        await self.conn.execute(REBIND_SQL, (request, credential_id, subscription_id))

    async def opened_by(self, operation_id: str) -> tuple[str, bytes, int] | None:
        cur = await self.conn.execute(OPENED_BY_SQL, (operation_id,))
        row = await cur.fetchone()
        return None if row is None else (str(row[0]), bytes(row[1]), int(row[2]))

    async def head_of(self, scope_id: str) -> tuple[bool, int]:
        """Whether the scope exists, and the ledger head, in one round trip."""
        cur = await self.conn.execute(HEAD_OF_SQL, (scope_id, self.partition))
        known, head = await cur.fetchone() or (False, 0)
        return bool(known), int(head)

    async def store_positions(self, positions: dict[str, tuple[int, int]]) -> None:
        """Acknowledged and last delivered sequence of open subscriptions, in one statement."""
        await self.conn.execute(POSITIONS_SQL, (list(positions), [p[0] for p in positions.values()],
                                                [p[1] for p in positions.values()]))

    async def mark_closing(self, subscription_id: str, reason: str, last_delivered: int, acked: int) -> None:
        await self.conn.execute(CLOSING_SQL, (reason, last_delivered, acked, subscription_id))

    async def mark_closed(self, subscription_id: str) -> None:
        await self.conn.execute(CLOSED_SQL, (subscription_id,))

    async def open_rows(self) -> list[tuple[str, bytes, int, str | None]]:
        """The partition's open subscriptions, the position each resumes from (acknowledged, else where it
        started) and the credential it is delivered under."""
        cur = await self.conn.execute(OPEN_ROWS_SQL, (self.partition,))
        return [(str(r[0]), bytes(r[1]), int(r[2]), r[3]) for r in await cur.fetchall()]

    async def closing_rows(self) -> list[tuple[str, bytes, str, int]]:
        """Closes an earlier leader decided but could not write to the ledger."""
        cur = await self.conn.execute(CLOSING_ROWS_SQL, (self.partition,))
        return [(str(r[0]), bytes(r[1]), str(r[2]), int(r[3])) for r in await cur.fetchall()]

    async def ended_at(self, subscription_id: str) -> int | None:
        """The last delivered sequence of a closed (or closing) subscription; None if it is not one."""
        cur = await self.conn.execute(ENDED_SQL, (subscription_id,))
        row = await cur.fetchone()
        return None if row is None else int(row[0])

    async def listing(self, everything: bool, actor_id: str | None, limit: int) -> list[dict[str, Any]]:
        """Up to `limit` open subscriptions (`everything`: closed ones too), oldest first, of `actor_id` only
        unless it is None; times in RFC 3339."""
        cur = await self.conn.execute(LIST_SQL, {"all": everything, "actor": actor_id, "limit": limit})
        return [{k: v.isoformat() if isinstance(v, datetime) else v for k, v in zip(LIST_COLUMNS, row)}
                for row in await cur.fetchall()]

    async def partition_of(self, subscription_id: str) -> int | None:
        """The partition a stored subscription belongs to (None: an unknown id)."""
        cur = await self.conn.execute(PARTITION_OF_SQL, (subscription_id,))
        row = await cur.fetchone()
        return None if row is None else int(row[0])

    async def owner_of(self, subscription_id: str) -> str | None:
        """The actor_id that opened a stored subscription (open or closed); None for an unknown id."""
        cur = await self.conn.execute(OWNER_SQL, (subscription_id,))
        row = await cur.fetchone()
        return None if row is None else row[0]

    async def check(self) -> None:
        """One round trip: raises a LOST_CONNECTION error when the database session is gone."""
        await self.conn.execute("SELECT 1")

    async def reconnect(self, stored: dict[str, int]) -> None:
        """A new session holding the gateway lock again, once the database answers. `stored` is what this
        gateway last wrote for each open subscription: if the table says otherwise (or another session
        holds the lock) someone else led meanwhile, and LeadershipLost says to start over."""
        while True:
            try:
                conn = await psycopg.AsyncConnection.connect(self.database_url, autocommit=True, connect_timeout=5)
            except LOST_CONNECTION:
                await asyncio.sleep(self.retry_seconds)
                continue
            try:
                await self._retake(conn, stored)
            except LOST_CONNECTION:
                await conn.close()
                await asyncio.sleep(self.retry_seconds)
                continue
            except BaseException:
                await conn.close()
                raise
            self._replaced.append(self.conn)
            self.conn = conn
            return

    async def _retake(self, conn: psycopg.AsyncConnection[Any], stored: dict[str, int]) -> None:
        cur = await conn.execute("SELECT pg_try_advisory_lock(%s)", (self.lock_key,))
        row = await cur.fetchone()
        if not (row and row[0]):
            raise LeadershipLost("another gateway holds the lock")
        cur = await conn.execute(OPEN_POSITIONS_SQL, (self.partition,))
        found = {str(r[0]): r[1] for r in await cur.fetchall()}
        moved = [s for s, position in stored.items() if found.get(s, -2) != position]
        if moved:
            raise LeadershipLost(f"{len(moved)} subscription positions changed while the database was away")

    async def close(self) -> None:
        """Close the sessions this store opened itself (the first one belongs to its caller)."""
        for conn in self._replaced[1:] + ([self.conn] if self._replaced else []):
            await conn.close()


_FOREIGN_SUBSCRIPTIONS = (
    "SELECT subscription_id, coalesce(acked_sequence, start_sequence), ledger_id FROM subscriptions"
    " WHERE status <> 'closed' AND partition = %(partition)s"
    " AND (ledger_id <> %(id)s OR coalesce(acked_sequence, start_sequence) > %(head)s)"
    " ORDER BY coalesce(acked_sequence, start_sequence) DESC")


async def subscriptions_disagreement(conn: psycopg.AsyncConnection[Any], partition: int) -> Disagreement | None:
    """None when every subscription of the partition not closed holds a position of the partition's ledger, not
    ahead of its head."""
    ledger_id = await ledger_identity(conn, partition)
    head = await ledger_head(conn, partition)
    await conn.execute("UPDATE subscriptions SET ledger_id = %s WHERE ledger_id IS NULL AND partition = %s"
                       " AND coalesce(acked_sequence, start_sequence) <= %s", (ledger_id, partition, head))
    rows = await (await conn.execute(_FOREIGN_SUBSCRIPTIONS, {"id": ledger_id, "head": head,
                                                               "partition": partition})).fetchall()
    if not rows:
        return None
    found = rows[0][2]
    return Disagreement(
        what="subscriptions",
        problem=f"positions of {len(rows)} open subscription(s) are not this ledger's (first: {rows[0][0]})",
        ledger_id=ledger_id, found_ledger_id=found, ledger_head=head, found_sequence=int(rows[0][1]),
        recovery=REBUILD_STREAM)


async def close_foreign_subscriptions(conn: psycopg.AsyncConnection[Any], partition: int) -> list[str]:
    """Close (reason `ledger_replaced`) every open subscription of the partition whose position is not its
    ledger's."""
    ledger_id = await ledger_identity(conn, partition)
    head = await ledger_head(conn, partition)
    rows = await (await conn.execute(_FOREIGN_SUBSCRIPTIONS, {"id": ledger_id, "head": head,
                                                               "partition": partition})).fetchall()
    ids = [str(r[0]) for r in rows]
    if ids:
        await conn.execute("UPDATE subscriptions SET status = 'closed', close_reason = 'ledger_replaced',"
                           " closed_at = now() WHERE subscription_id = ANY(%s)", (ids,))
    return ids
