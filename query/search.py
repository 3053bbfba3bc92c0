"""Running a Query: freshness (min_sequence), one consistent snapshot, canonical reply bytes.

Current-state queries read the projection and report the projection checkpoint as `as_of_sequence`,
read in the same REPEATABLE READ snapshot as the rows. `as_of_sequence` in the request answers from the
immutable versions instead ("the scope as it was at ledger sequence N").
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import msgspec
import psycopg
from psycopg import sql

from infra.pg_pipeline import pipelined_transaction
from infra.ledger import HEAD
from infra.projections import CHECKPOINT, NOTIFY_CHANNEL, PROJECTION, checkpoint
from infra.scopes import SCOPE_EXISTS
from query.connections import Connections
from query.cursor import decode_cursor, encode_cursor
from query.cursor_keys import CursorSigner
from query.plan import build
from query.snapshot import BEGIN_SNAPSHOT
from query.snapshots import Pinned, SealedSnapshots, lost_statement, report_of
from schemas.queries import QueryRequest
from schemas.canonical import canonical_bytes, decode_json
from schemas.errors import InvalidRequest, ScopeNotFound
from schemas.replies import envelope_bytes



_STATE = f"SELECT {SCOPE_EXISTS}, {CHECKPOINT}, {HEAD}"


class CheckpointWatcher:
    """One follower's checkpoint, pushed by the NOTIFY its commits send, so waiters wake at once.

    Keyed by follower (its checkpoint row and notify channel): a query waits for the projection, a search
    for the index, each on its own watcher."""

    def __init__(self, checkpoint_name: str = PROJECTION, channel: str = NOTIFY_CHANNEL) -> None:
        self.checkpoint_name = checkpoint_name
        self.channel = channel
        self.sequence = 0
        self._changed = asyncio.Condition()

    async def run(self, database_url: str) -> None:
        while True:
            try:
                async with await psycopg.AsyncConnection.connect(database_url, autocommit=True) as conn:
                    await conn.execute(sql.SQL("LISTEN {}").format(sql.Identifier(self.channel)))
                    await self._set(await checkpoint(conn, self.checkpoint_name))
                    async for note in conn.notifies():
                        await self._set(int(note.payload))
            except psycopg.OperationalError:
                await asyncio.sleep(0.5)

    async def _set(self, sequence: int) -> None:
        async with self._changed:
            if sequence > self.sequence:
                self.sequence = sequence
                self._changed.notify_all()

    async def wait_for(self, sequence: int, timeout: float) -> bool:
        async with self._changed:
            try:  # asyncio.timeout, not wait_for: on 3.11 wait_for can swallow a cancellation
                async with asyncio.timeout(timeout):
                    await self._changed.wait_for(lambda: self.sequence >= sequence)
            except TimeoutError:
                return False
        return True


async def run_query(pool: Connections, watcher: CheckpointWatcher, request: QueryRequest,
                    partition: int, signer: CursorSigner, caller: str,
                    fork: tuple[str, int, list[str] | None] | None = None,
                    sealed: SealedSnapshots | None = None) -> bytes:
    """One page of a Query; its cursor signed by `signer` and bound to `caller` (query.cursor); `fork`: the
    scope is an evaluation scope reading its snapshot (base scope, watermark, members) beside its own objects."""
    after, pinned = decode_cursor(request, signer, caller)
    as_of = request.as_of_sequence if request.as_of_sequence is not None else pinned
    pin: Pinned | None = None
    if request.snapshot_id is not None:  # the scope as the snapshot pins it: its watermark, its members
        pin = await (sealed or SealedSnapshots()).pin(pool, request.scope_id, request.snapshot_id)
        as_of = pin.watermark
    reached = True
    if request.min_sequence is not None and as_of is None and watcher.sequence < request.min_sequence:
        reached = await watcher.wait_for(request.min_sequence, request.wait_ms / 1000)
    # A past sequence reads the projection for what has not changed since, once the projector is there (a
    # snapshot sealed a moment ago waits that moment); before, from the versions alone: the same rows, slower.
    # An evaluation scope's fork reads its snapshot's watermark the same way.
    past = fork[1] if fork is not None and as_of is None else as_of
    from_projection = past is not None and (watcher.sequence >= past or (
        (pin is not None or fork is not None) and await watcher.wait_for(past, min(request.wait_ms, 1000) / 1000)))
    statement, params = build(request, after, as_of, pin.members if pin is not None else None, from_projection,
                              partition, fork)
    async with pool.connection() as conn:
        # One snapshot for the scope check, the checkpoint and the rows (and, at an evaluation snapshot, the
        # count of its erased versions); pipelined, so the whole transaction costs one round trip. Rows of an
        # unknown scope are empty and never returned.
        async with pipelined_transaction(conn, BEGIN_SNAPSHOT):
            state = await conn.execute(_STATE, (request.scope_id, watcher.checkpoint_name, partition))
            found = await conn.execute(statement, params)
            lost = await conn.execute(*lost_statement(pin)) if pin is not None else None
        known, projected, head = await state.fetchone() or (False, 0, 0)
        rows = await found.fetchall()
        erased = (await lost.fetchone() or (0,))[0] if lost is not None else 0
    if not known:
        raise ScopeNotFound("scope not found", details={"scope_id": request.scope_id})
    if as_of is not None and as_of > head:
        raise InvalidRequest("as_of_sequence is beyond the ledger head", details={"as_of_sequence": as_of})
    snapshot = as_of if as_of is not None else projected
    cursor = (lambda key: encode_cursor(request, key, as_of, signer, caller))
    return _reply(request, rows, snapshot, as_of, reached, report_of(pin, int(erased)) if pin is not None else None,
                  cursor)


def _reply(request: QueryRequest, rows: list[Any], snapshot: int, as_of: int | None, reached: bool,
           report: dict[str, Any] | None, cursor: Callable[[list[Any]], str]) -> bytes:
    page = rows[: request.limit]
    items = []
    for row in page:
        item: dict[str, Any] = {
            "envelope": msgspec.Raw(envelope_bytes(decode_json(bytes(row[0])), bytes(row[1]) if row[1] else None)),
            "ledger_sequence": row[-3],
        }
        if request.order == "score":
            item["score"] = row[2]
        items.append(item)
    next_cursor = None
    if len(rows) > request.limit:
        next_cursor = cursor(list(page[-1][2:]))
    result: dict[str, Any] = {"items": items, "next_cursor": next_cursor, "as_of_sequence": snapshot,
                              "order": request.order}
    if request.min_sequence is not None:
        result["min_sequence_reached"] = reached and snapshot >= request.min_sequence
    if report is not None:
        result["snapshot"] = report
    return canonical_bytes({"result": result})
