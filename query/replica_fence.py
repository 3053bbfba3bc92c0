"""The fence a read on a replica passes first: the replica has replayed the primary's position at the request.

Why: a streaming replica applies the primary's WAL a moment after the primary committed it. A client that was
told "created at sequence 41" must find it (read-your-writes, `min_sequence`), and one told "erased" must not
see the content again: the writer deletes `content_store` rows in its COMMIT, and a replica keeps them until it
replays that COMMIT. So a request routed to a replica reads the primary's WAL insert position (every commit
visible on the primary lies before it) and waits until the replica has replayed that far; a snapshot taken
after that sees everything the primary showed when the request arrived, including every projection checkpoint
the primary's watchers had seen.

The followers commit with synchronous_commit off (pamledger.runtime), so their last commits may sit in the
primary's WAL buffers until the WAL writer flushes them (up to wal_writer_delay, 200 ms by default), and a
replica only receives flushed WAL. When the primary has such unflushed WAL, the position statement flushes it
by writing a tiny non-transactional WAL message with flush (pg_logical_emit_message, prefix `pamledger.fence`:
no transaction id, executable by any role); when everything is flushed it writes nothing.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import psycopg

from query.connections import Connections

PRIMARY_POSITION = (b"SELECT (CASE WHEN pg_current_wal_flush_lsn() < pg_current_wal_insert_lsn()"
                    b" THEN pg_logical_emit_message(false, 'pamledger.fence', '', true)"
                    b" ELSE pg_current_wal_insert_lsn() END)::text")
# NULL: not in recovery (a primary, or a promoted replica): never a place for fenced reads.
REPLAY_GAP = b"SELECT (%s::pg_lsn - pg_last_wal_replay_lsn())::bigint"
FIRST_POLL_SECONDS = 0.0005
MAX_POLL_SECONDS = 0.005


class NotAReplica(Exception):
    """A read URL names a server that is not replaying a primary's WAL."""


class PrimaryPosition:
    """The primary's WAL position, flushed, read by a statement that starts after the caller asked.

    Callers who ask while a read is running share the next one, so a burst of requests costs the primary one
    trivial statement per round trip, not one each."""

    def __init__(self, primary: Connections) -> None:
        self.primary = primary
        self._next: asyncio.Future[str] | None = None
        self._reader: asyncio.Task[None] | None = None

    async def read(self) -> str:
        """A flushed position (as text, e.g. "0/1A2B3C8") after every commit visible on the primary before this
        call."""
        if self._next is None:
            self._next = asyncio.get_running_loop().create_future()
            if self._reader is None:
                self._reader = asyncio.create_task(self._read_rounds())
        return await asyncio.shield(self._next)

    async def _read_rounds(self) -> None:
        try:
            while self._next is not None:
                waiting, self._next = self._next, None
                try:
                    async with self.primary.connection() as conn:
                        row = await (await conn.execute(PRIMARY_POSITION)).fetchone()
                    waiting.set_result(str(row[0]) if row else "0/0")
                except Exception as exc:  # noqa: BLE001 - each waiter gets the failure and falls back
                    waiting.set_exception(exc)
                    waiting.exception()  # retrieved: a waiter cancelled meanwhile leaves no warning behind
        finally:
            self._reader = None


async def replay_gap(conn: psycopg.AsyncConnection[Any], target: str, timeout: float) -> int:
    """Wait up to `timeout` seconds until the replica on `conn` has replayed `target`; return the bytes of WAL
    still missing then (0: reached). Polls with a short growing interval: a loopback replica replays a
    commit in well under a millisecond, and PostgreSQL 18 has no statement that waits for an LSN."""
    deadline = time.monotonic() + timeout
    interval = FIRST_POLL_SECONDS
    while True:
        row = await (await conn.execute(REPLAY_GAP, (target,))).fetchone()
        if row is None or row[0] is None:
            raise NotAReplica("not in recovery: pg_last_wal_replay_lsn() is NULL")
        gap = int(row[0])
        if gap <= 0:
            return 0
        if time.monotonic() >= deadline:
            return gap
        await asyncio.sleep(interval)
        interval = min(interval * 2, MAX_POLL_SECONDS)
