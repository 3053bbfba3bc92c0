"""infra.pg_pipeline: a pipelined transaction commits all or nothing and leaves the connection usable."""

from __future__ import annotations

from collections.abc import AsyncIterator

import psycopg
import pytest
from psycopg.pq import TransactionStatus

from infra.pg_pipeline import pipelined_transaction
from tests.conftest import Servers, fresh_database


@pytest.fixture(scope="module")
def database_url(servers: Servers) -> str:
    return fresh_database(servers, "pg_pipeline")


@pytest.fixture
async def conn(database_url: str) -> AsyncIterator[psycopg.AsyncConnection[object]]:
    async with await psycopg.AsyncConnection.connect(database_url, autocommit=True) as c:
        await c.execute("CREATE TABLE IF NOT EXISTS pipeline_t (k int PRIMARY KEY)")
        await c.execute("TRUNCATE pipeline_t")
        yield c


async def _keys(conn: psycopg.AsyncConnection[object]) -> list[int]:
    cur = await conn.execute("SELECT k FROM pipeline_t ORDER BY k")
    return [int(r[0]) for r in await cur.fetchall()]  # type: ignore[call-overload]


async def test_statements_commit_together_and_results_are_read_after_the_block(conn: psycopg.AsyncConnection[object]) -> None:
    async with pipelined_transaction(conn, b"BEGIN ISOLATION LEVEL REPEATABLE READ"):
        await conn.execute("INSERT INTO pipeline_t VALUES (1), (2)")
        level = await conn.execute("SHOW transaction_isolation")
    assert (await level.fetchone()) == ("repeatable read",)
    assert conn.info.transaction_status == TransactionStatus.IDLE
    assert await _keys(conn) == [1, 2]


async def test_a_refused_statement_rolls_back_everything_before_it(conn: psycopg.AsyncConnection[object]) -> None:
    with pytest.raises(psycopg.errors.UniqueViolation):
        async with pipelined_transaction(conn):
            await conn.execute("INSERT INTO pipeline_t VALUES (1)")
            await conn.execute("INSERT INTO pipeline_t VALUES (1)")
            await conn.execute("INSERT INTO pipeline_t VALUES (2)")
    assert conn.info.transaction_status == TransactionStatus.IDLE
    assert await _keys(conn) == []


async def test_an_exception_in_the_block_rolls_back(conn: psycopg.AsyncConnection[object]) -> None:
    with pytest.raises(RuntimeError):
        async with pipelined_transaction(conn):
            await conn.execute("INSERT INTO pipeline_t VALUES (3)")
            raise RuntimeError("the caller gave up")
    assert conn.info.transaction_status == TransactionStatus.IDLE
    assert await _keys(conn) == []


async def test_it_refuses_a_connection_that_is_not_in_autocommit(database_url: str) -> None:
    async with await psycopg.AsyncConnection.connect(database_url) as c:
        with pytest.raises(ValueError):
            async with pipelined_transaction(c):
                pass


async def test_a_failed_pipeline_never_leaves_a_statement_psycopg_thinks_is_prepared(
        conn: psycopg.AsyncConnection[object]) -> None:
    """psycopg prepares a statement on its 5th execution; if that happens after the failing statement of an
    aborted pipeline (and the connection has rolled back before), it used to stay recorded as prepared
    though the server never parsed it, and every later transaction failed ("_pg3_N does not exist")."""
    async def batch(key: int, notify: bool = True) -> None:
        async with pipelined_transaction(conn):
            await conn.execute(b"INSERT INTO pipeline_t VALUES (%s)", (key,))
            if notify:
                await conn.execute(b"SELECT pg_notify(%s, %s)", ("pipeline_t", "x"))

    await batch(1, notify=False)
    for _ in range(2):  # psycopg acts on the first ROLLBACK only
        with pytest.raises(psycopg.errors.UniqueViolation):
            await batch(1, notify=False)
    for key in range(2, 7):  # the NOTIFY runs 5 times: the next one is prepared
        await batch(key)
    with pytest.raises(psycopg.errors.UniqueViolation):
        await batch(2)  # ... here, after the failing INSERT, so the server skips its Parse
    for key in range(7, 10):
        await batch(key)
    assert await _keys(conn) == list(range(1, 10))
