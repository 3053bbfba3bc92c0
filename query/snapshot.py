"""One read-only, repeatable-read snapshot for every statement of a request (search, hybrid, related)."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from typing import Any

import psycopg

BEGIN_SNAPSHOT = b"BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY"


@contextlib.asynccontextmanager
async def snapshot(conn: psycopg.AsyncConnection[Any]) -> AsyncIterator[None]:
    """Every statement of the block in one snapshot (a pool connection is in autocommit mode); read only, so
    it is ended by ROLLBACK whatever happened (a dead connection the pool drops)."""
    await conn.execute(BEGIN_SNAPSHOT)
    try:
        yield
    finally:
        with contextlib.suppress(psycopg.Error):
            await conn.execute(b"ROLLBACK")
