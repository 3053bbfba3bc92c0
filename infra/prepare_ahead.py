"""Prepare the next batch while the follower's transaction writes this one (the indexer: embed batch k+1 while
batch k's vectors go into the HNSW index).

Why: a preparing step's two halves use different CPUs (the model in this process, the index inserts in the
Postgres backend); run one after the other, each waits for the other. Under backlog the next batch is
already buffered, so its `prepare` can run beside the current batch's transaction.

Why a connection of its own: the follower's connection is inside the transaction while the next batch
prepares, and a connection serves one statement at a time. `prepare` gets a second connection (autocommit,
opened on first use, re-opened after a prepare was cut short mid-query).

What stays as it was: only events that are contiguous after the current batch are prepared ahead, and the
follower then takes exactly those as its next batch; a prepared-ahead result is used only for the very
same events, and is discarded (its task cancelled and awaited: no orphan) when the batch before fails, on a
re-subscription and when the follower stops. A prepare that failed ahead fails the next batch the way a
prepare failing in place would (the per-event fallback then finds the event).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any, Protocol

import psycopg

from pamledger_client.protocol.tasks import stop_task

Event = tuple[int, bytes]  # (ledger sequence, the event's bytes as the stream carries them)
Connect = Callable[[], Awaitable[psycopg.AsyncConnection[Any]]]


class PreparingStep(Protocol):
    """A step with slow work to do before its transaction (the indexer embeds there).

    `prepare(conn, events, pending)` runs outside any transaction, on a connection of its own, and returns
    what `apply_prepared` is then called with, inside the follower's transaction, for the same events.
    `pending` is what was prepared for the batch before, when that batch's transaction may still be running
    (None: every earlier batch has committed). What `prepare` reads may change before `apply_prepared`
    commits, including by that pending batch: `apply_prepared` must write only what is still true, and
    `prepare` must not trust what the pending batch may change; it returns None when it cannot prepare
    ahead of `pending` at all (the follower then prepares again after that batch committed)."""

    async def prepare(self, conn: psycopg.AsyncConnection[Any], events: list[Event],
                      pending: Any | None) -> Any | None: ...

    async def apply_prepared(self, conn: psycopg.AsyncConnection[Any], events: list[Event],
                             prepared: Any) -> None: ...


class Ahead:
    """At most one prepare running ahead of the follower's transaction, and its connection.

    Without `connect` nothing runs ahead: `prepare` runs in place on the follower's connection, before the
    transaction (what a follower built without a connection factory does)."""

    def __init__(self, step: PreparingStep, follower_conn: psycopg.AsyncConnection[Any],
                 connect: Connect | None):
        self.step = step
        self._follower_conn = follower_conn
        self._connect = connect
        self._own: psycopg.AsyncConnection[Any] | None = None
        self._task: asyncio.Task[Any] | None = None
        self._sequences: list[int] = []
        self.span = 0  # buffered deliveries the prepared-ahead batch covers (the follower takes exactly those)

    async def _conn(self) -> psycopg.AsyncConnection[Any]:
        if self._connect is None:
            return self._follower_conn
        if self._own is None or self._own.closed or self._own.broken:
            self._own = await self._connect()
        return self._own

    def lost(self) -> bool:
        """The prepare connection broke: not the events' fault (the follower reconnects)."""
        return self._own is not None and (self._own.broken or self._own.closed)

    async def prepared_for(self, events: list[Event]) -> Any:
        """What the step prepared for exactly these events: the result prepared ahead when it is for them,
        else a prepare now (every batch before has committed)."""
        task, sequences = self._task, self._sequences
        self._task, self._sequences, self.span = None, [], 0
        if task is not None:
            if sequences == [seq for seq, _ in events]:
                result = await task  # a failure here fails this batch, as a prepare in place would
                if result is not None:
                    return result
            else:
                await self._stop(task)
        return await self.step.prepare(await self._conn(), events, None)

    def start(self, events: list[Event], span: int, pending: Any) -> None:
        """Prepare `events` (the next `span` buffered deliveries) while `pending`'s transaction runs."""
        if self._connect is None or not events or self._task is not None:
            return
        self._sequences, self.span = [seq for seq, _ in events], span
        self._task = asyncio.create_task(self._prepare(events, pending))

    async def _prepare(self, events: list[Event], pending: Any) -> Any:
        return await self.step.prepare(await self._conn(), events, pending)

    async def discard(self) -> None:
        """Drop the prepared-ahead batch (the batch before failed, or the buffer was reset)."""
        task = self._task
        self._task, self._sequences, self.span = None, [], 0
        if task is not None:
            await self._stop(task)

    async def _stop(self, task: asyncio.Task[Any]) -> None:
        cut = not task.done()
        await stop_task(task)  # waits until it ended, and retrieves its exception
        if cut and self._own is not None:  # it may have stopped mid-query: never reuse that session
            own, self._own = self._own, None
            await own.close()

    async def close(self) -> None:
        await self.discard()
        if self._own is not None:
            own, self._own = self._own, None
            await own.close()
