"""When a replay fails on what the ledger holds, find the ledger event it cannot project and name it.

Why: a bulk rebuild fails somewhere inside one COPY or one merge of a million rows, or in the full-text
vectors of the whole content store, so Postgres' error (`UntranslatableCharacter`, ...) names no event.
An operator needs the ledger sequence. This pass projects the events again in ledger order, in chunks,
into a scratch table that is rolled back, and narrows a failing chunk down to its first failing event.
It runs only after a failure.
"""

from __future__ import annotations

from typing import Any

import msgspec
import psycopg
from psycopg import sql

from infra.stuck import describe
from projector.rows import Row, project
from projector.store import merge, stage, upsert_relationships
from schemas.errors import PamledgerError

CHUNK = 1000
_SCRATCH = "replay_diagnosis"
_SCRATCH_RELATIONSHIPS = "replay_diagnosis_relationships"


class ReplayFailed(PamledgerError):
    """Replay stopped on an event the projection cannot hold; `details` name its ledger sequence."""

    code = "internal_error"


# What the stored data can cause (a value Postgres refuses, an event that does not decode), as opposed to
# a lost connection or a cancelled statement, which name no event.
DATA_ERRORS: tuple[type[Exception], ...] = (psycopg.DataError, psycopg.IntegrityError, psycopg.ProgrammingError,
                                            psycopg.InternalError, msgspec.MsgspecError)


async def replay_failed(database_url: str, partitions: tuple[int, ...], scope_id: str | None, through: int | None,
                        cause: Exception) -> ReplayFailed:
    """The error to raise for a replay of `partitions` that failed with `cause`: naming the first event that
    cannot be projected (up to `through`, None: the head), or saying that no single event reproduces it.
    Outside a one-partition ledger's partition 0 the event's partition is named too (its sequence is that
    partition's)."""
    found = None
    try:
        for partition in partitions:
            if (found := await first_unprojectable(database_url, partition, scope_id, through)) is not None:
                break
    except psycopg.Error:  # the search itself failed (the database went away, no projection table): say so
        found = None
    if found is None:
        return ReplayFailed(f"replay failed: {describe(cause)} (no single ledger event reproduces it)",
                            details={"reason": describe(cause)})
    sequence, reason = found
    where = {} if partitions == (0,) else {"partition": partition}
    return ReplayFailed(f"replay cannot project ledger sequence {sequence}{_of(where)}: {reason}",
                        details={"ledger_sequence": sequence, **where, "reason": reason})


def _of(where: dict[str, int]) -> str:
    return f" of partition {where['partition']}" if where else ""


async def first_unprojectable(database_url: str, partition: int, scope_id: str | None, through: int | None,
                              ) -> tuple[int, str] | None:
    """(ledger sequence, reason) of the first event whose row cannot be built or written, or None."""
    async with await psycopg.AsyncConnection.connect(database_url) as reader, \
            await psycopg.AsyncConnection.connect(database_url) as conn:
        async with conn.transaction(force_rollback=True):
            await conn.execute(sql.SQL("CREATE TEMP TABLE {} (LIKE current_objects EXCLUDING ALL) ON COMMIT DROP")
                               .format(sql.Identifier(_SCRATCH)))
            await conn.execute(sql.SQL("CREATE TEMP TABLE {} (LIKE current_relationships INCLUDING INDEXES)"
                                       " ON COMMIT DROP").format(sql.Identifier(_SCRATCH_RELATIONSHIPS)))
            async with reader.transaction():
                cursor = reader.cursor(name="replay_diagnosis")
                await cursor.execute(_events(partition, scope_id, through))
                while chunk := await cursor.fetchmany(CHUNK):
                    found = await _first_failing(conn, [(int(seq), bytes(event)) for seq, event in chunk])
                    if found is not None:
                        return found
    return None


def _events(partition: int, scope_id: str | None, through: int | None) -> sql.Composed:
    scope = sql.SQL(" AND scope_id = {}").format(sql.Literal(scope_id)) if scope_id else sql.SQL("")
    upto = sql.SQL(" AND ledger_sequence <= {}").format(sql.Literal(through)) if through is not None else sql.SQL("")
    return sql.SQL("SELECT ledger_sequence, event FROM ledger WHERE partition = {}{}{} ORDER BY ledger_sequence"
                   ).format(sql.Literal(partition), scope, upto)


async def _first_failing(conn: psycopg.AsyncConnection[Any], events: list[tuple[int, bytes]],
                         ) -> tuple[int, str] | None:
    """Write the events' rows (every one, not only the newest per object) in a savepoint; if that fails,
    halve until one event is left. Everything is rolled back."""
    try:
        async with conn.transaction(force_rollback=True):
            rows: list[Row] = []
            relationships: dict[tuple[str, str], Row] = {}  # one per relationship per statement: the newest
            for seq, event in events:
                found = project(event, seq)
                if found is not None and found.relationship:
                    relationships[(found.row[0], found.row[1])] = found.row
                elif found is not None:
                    rows.append(found.row)
            await stage(conn, rows)
            await merge(conn, _SCRATCH, upsert=False)
            await upsert_relationships(conn, list(relationships.values()), _SCRATCH_RELATIONSHIPS)
        return None
    except DATA_ERRORS as exc:
        if len(events) == 1:
            return events[0][0], describe(exc)
    middle = len(events) // 2
    return await _first_failing(conn, events[:middle]) or await _first_failing(conn, events[middle:])
