"""Leadership of a role: waiting for its advisory lock, and the backoff of a role's loop after a failure.

Why a module of its own: every role loop (pamledger.runtime, pamledger.writer_role) takes its partition's lock
the same way, and a process leading several partitions takes one lock per partition.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

import psycopg
import structlog

from infra.role_failures import RoleFailures
from infra.settings import Settings

log = structlog.get_logger(__name__)
TAKEOVER_POLLS = 5  # a partition free this many polls in a row is taken past a process's share


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


async def wait_for_partition_lock(conn: psycopg.AsyncConnection[Any], key: int, settings: Settings, role: str,
                                  partition: int, held: set[int], quiet: bool = False) -> None:
    """wait_for_lock for one of several partitions, `held` those this process leads in `role` (the partition
    is added when its lock is taken). Within writer.partition_share (0: no share; a count per role of a
    process) a free partition is taken at once; past it, only once it has been free for TAKEOVER_POLLS polls
    in a row (the lock is taken and given back meanwhile), so a process started beside this one takes its
    share first, and the partitions of a process that died are taken over all the same."""
    share = settings.writer.partition_share
    poll = settings.writer.lock_poll_seconds
    free_since: float | None = None
    announced = False
    while True:
        row = await (await conn.execute("SELECT pg_try_advisory_lock(%s)", (key,))).fetchone()
        if row and row[0]:
            now = time.monotonic()
            free_since = now if free_since is None else free_since
            if share <= 0 or len(held) < share or now - free_since >= TAKEOVER_POLLS * poll:
                held.add(partition)  # no await since the check: the share is kept across this process's tasks
                (log.debug if quiet else log.info)("leadership.acquired", role=role, partition=partition,
                                                   leading=len(held))
                return
            await conn.execute("SELECT pg_advisory_unlock(%s)", (key,))
        else:
            free_since = None
        if not announced:
            log.info("leadership.waiting", role=role, partition=partition)
            announced = True
        await asyncio.sleep(poll)


@contextlib.asynccontextmanager
async def partition_lock(conn: psycopg.AsyncConnection[Any], key: int, settings: Settings, role: str,
                         partition: int, held: set[int] | None, quiet: bool = False) -> AsyncIterator[None]:
    """Lead `role` in `partition` for the block: wait for its lock `key` on `conn`'s session, within this
    process's share of the role's partitions (`held`, wait_for_partition_lock) or, with None (one partition),
    as soon as it is free. The lock ends with the session; the partition leaves `held` with the block."""
    if held is None:
        await wait_for_lock(conn, key, settings, role, quiet, partition)
        yield
        return
    await wait_for_partition_lock(conn, key, settings, role, partition, held, quiet)
    try:
        yield
    finally:
        held.discard(partition)
