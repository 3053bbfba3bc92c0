"""A whole transaction in one pipeline: BEGIN, the statements and COMMIT sent together, one round trip.

psycopg's `conn.transaction()` inside `conn.pipeline()` syncs with the server as the block opens and
again as it closes, so a pipelined transaction still waited for several round trips. Measured here on a
1-row projector batch (BEGIN, checkpoint upsert, insert, NOTIFY, COMMIT): 3.2 ms p50 that way, 1.3 ms
with BEGIN and COMMIT sent as statements in the same pipeline. Results are read from the cursors after
the block: the pipeline is synced as it exits.
"""

from __future__ import annotations

import contextlib
import itertools
from collections.abc import AsyncIterator
from typing import Any

import psycopg
from psycopg.pq import TransactionStatus


@contextlib.asynccontextmanager
async def pipelined_transaction(conn: psycopg.AsyncConnection[Any], begin: bytes = b"BEGIN") -> AsyncIterator[None]:
    """Run the block's statements between `begin` and COMMIT, pipelined, on an autocommit connection.
    Any failure (a statement refused, an exception in the block) rolls the transaction back and raises."""
    if not conn.autocommit:
        raise ValueError("pipelined_transaction needs an autocommit connection (it sends BEGIN itself)")
    try:
        async with conn.pipeline():
            await conn.execute(begin)
            yield
            await conn.execute(b"COMMIT")
    except BaseException:
        if conn.info.transaction_status in (TransactionStatus.INTRANS, TransactionStatus.INERROR):
            with contextlib.suppress(psycopg.Error):
                await conn.execute(b"ROLLBACK")
        await _forget_prepared(conn)
        raise


_forgotten = itertools.count()


async def _forget_prepared(conn: psycopg.AsyncConnection[Any]) -> None:
    """Drop the session's prepared statements, on the server and in psycopg's cache.

    Why: a statement psycopg prepares for the first time AFTER the failing one in an aborted pipeline is
    recorded as prepared although the server skipped its Parse, and psycopg clears that record only on the
    first execution of a given ROLLBACK or DEALLOCATE ALL text (later ones are answered from its counts).
    Every later use then fails with "prepared statement _pg3_N does not exist", for good. A DEALLOCATE ALL
    with a text psycopg has not seen makes it validate the result and clear its cache."""
    with contextlib.suppress(psycopg.Error):
        await conn.execute(f"DEALLOCATE ALL /* pamledger {next(_forgotten)} */".encode())
