"""Leadership of a role: waiting for its advisory lock, and the backoff of a role's loop after a failure.

Why a module of its own: every role loop (pamledger.runtime, pamledger.writer_role) takes its partition's lock
the same way, and a process leading several partitions takes one lock per partition.
"""

from __future__ import annotations

import asyncio
from typing import Any

import psycopg
import structlog

from infra.role_failures import RoleFailures
from infra.settings import Settings

log = structlog.get_logger(__name__)


def role_failures(settings: Settings, role: str) -> RoleFailures:
    """A role loop's failure log and backoff: from the lock poll interval up to 10x it, afresh once a run
    has lasted `role_healthy_seconds`."""
    poll = settings.writer.lock_poll_seconds
    return RoleFailures(role, poll, 10 * poll, settings.writer.role_healthy_seconds)


async def wait_for_lock(conn: psycopg.AsyncConnection[Any], key: int, settings: Settings, role: str,
                        quiet: bool = False, partition: int | None = None) -> None:
    """Return once this session holds the advisory lock `key` (polled every lock_poll_seconds): leadership
    of `role` in `partition` (the settings' own when None)."""
    partition = settings.partition if partition is None else partition
    announced = False
    while True:
        cur = await conn.execute("SELECT pg_try_advisory_lock(%s)", (key,))
        row = await cur.fetchone()
        if row and row[0]:
            (log.debug if quiet else log.info)("leadership.acquired", role=role, partition=partition)
            return
        if not announced:
            log.info("leadership.waiting", role=role, partition=partition)
            announced = True
        await asyncio.sleep(settings.writer.lock_poll_seconds)
