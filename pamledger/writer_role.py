"""The writer role: lead each partition's writer while this process holds its advisory lock.

With one partition (the default) a process is its writer or a hot standby, as ever. With several, every
writer process tries every partition's lock: it leads whichever are free, and when another writer process
dies (its database session ends and Postgres releases its locks) the others take its partitions over within
`lock_poll_seconds`. The process that leads partition 0 also routes the clients' commands to the partitions
(command_handler.router).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import psycopg

from command_handler.relay import Relay
from command_handler.router import Router
from command_handler.store import PostgresLedgerStore
from command_handler.writer import Command, Writer
from infra import locks
from infra.cleanup import run_to_end
from infra.metrics import leads
from infra.nats_raw import RawClient
from infra.partitions import partition_stream, recorded_partitions_async
from infra.request_shell import Policy
from infra.role_failures import RoleFailures
from infra.settings import Settings
from infra.nats_servers import StreamReplicas
from pamledger_client.protocol.tasks import reraise_if_cancelled, stop_task
from pamledger.leadership import role_failures, wait_for_lock, wait_for_partition_lock

LocalWriters = dict[int, Callable[[Command], None]]


class Partitions:
    """What this process's writer leadership shares across its partitions: the partitions whose lock it holds
    (its share, pamledger.leadership) and the writers serving, by partition (the router's local hand-off)."""

    def __init__(self) -> None:
        self.held: set[int] = set()
        self.local: LocalWriters = {}


async def lead_forever(settings: Settings, nc: RawClient, database_url: str, policy: Policy | None = None,
                       replicas: StreamReplicas = StreamReplicas(1)) -> None:
    """Lead the writer of the settings' partition (one partition) or of every partition this process can lock;
    `replicas`: the copies each partition's stream keeps (nats.stream_replicas, infra.nats_servers)."""
    if settings.partitions == 1:
        await lead_partition_forever(settings, nc, database_url, settings.partition, policy, None, replicas)
        return
    shared = Partitions()
    await asyncio.gather(*(lead_partition_forever(settings, nc, database_url, partition, policy, shared, replicas)
                           for partition in range(settings.partitions)))


async def lead_partition_forever(settings: Settings, nc: RawClient, database_url: str, partition: int,
                                 policy: Policy | None, shared: Partitions | None,
                                 replicas: StreamReplicas = StreamReplicas(1)) -> None:
    """Wait for the partition's writer lock, serve as its writer, and go back to waiting if the database
    session dies."""
    failures = role_failures(settings, leadership_name(settings, partition))
    while True:
        try:
            await _lead_once(settings, nc, database_url, partition, failures, policy, shared, replicas)
        except (psycopg.OperationalError, psycopg.InterfaceError) as exc:
            await asyncio.sleep(failures.failed(exc, expected=True))
        except Exception as exc:  # noqa: BLE001 - a writer bug must not leave the process serving without a writer
            await asyncio.sleep(failures.failed(exc, expected=False))
        else:
            await asyncio.sleep(settings.writer.lock_poll_seconds)


def leadership_name(settings: Settings, partition: int) -> str:
    """The role's name in logs, metrics and /readyz: `writer`, or `writer.p<partition>` with several."""
    return "writer" if settings.partitions == 1 else f"writer.p{partition}"


async def _lead_once(settings: Settings, nc: RawClient, database_url: str, partition: int, failures: RoleFailures,
                     policy: Policy | None, shared: Partitions | None, replicas: StreamReplicas) -> None:
    async with await psycopg.AsyncConnection.connect(database_url, autocommit=True) as conn:
        try:
            await _lead_locked(settings, nc, conn, database_url, partition, failures, policy, shared, replicas)
        finally:
            if shared is not None:
                shared.held.discard(partition)  # the session ends with this block: so does the lock


async def _lead_locked(settings: Settings, nc: RawClient, conn: psycopg.AsyncConnection[Any], database_url: str,
                       partition: int, failures: RoleFailures, policy: Policy | None, shared: Partitions | None,
                       replicas: StreamReplicas) -> None:
    store = PostgresLedgerStore(conn, partition)
    # A retry after a failure takes the lock again: said once, by the failure, not per attempt.
    key, quiet = locks.writer_key(partition), failures.attempts > 0
    if shared is None:
        await wait_for_lock(conn, key, settings, "writer", quiet=quiet, partition=partition)
    else:
        await wait_for_partition_lock(conn, key, settings, "writer", partition, shared.held, quiet)
    await recorded_partitions_async(conn, settings.partitions)  # never append under a changed count
    relay = Relay(nc, database_url, partition_stream(settings.stream_name, partition), settings.subject_prefix,
                  partition, settings.writer.relay_publish_timeout_seconds, replicas,
                  partitioned=settings.partitions > 1)
    side_tasks = [asyncio.create_task(relay.run())]
    name = leadership_name(settings, partition)
    leads(name, True)
    try:
        local = shared.local if shared is not None else None
        if partition == 0 and local is not None:
            side_tasks.append(asyncio.create_task(_route_forever(settings, nc, database_url, local)))
        with failures.running():
            await Writer(settings, nc, store, relay.submit, relay.status, policy=policy, local=local).serve()
    finally:
        leads(name, False)
        # To its end even under the repeated cancels of a role's stop: a router or relay left pending would run
        # on unowned (found as a router coroutine collected mid-query after its service had stopped).
        await run_to_end(_stop_all(side_tasks))


async def _stop_all(tasks: list[asyncio.Task[None]]) -> None:
    for task in tasks:
        await stop_task(task)


async def _route_forever(settings: Settings, nc: RawClient, database_url: str, local: LocalWriters) -> None:
    """Route the clients' commands while this process leads partition 0; on its own connection, reconnected
    when the database goes away."""
    failures = role_failures(settings, "router")
    while True:
        try:
            async with await psycopg.AsyncConnection.connect(database_url, autocommit=True) as conn:
                with failures.running():
                    await Router(nc, conn, settings.subject_prefix, settings.partitions, local).serve()
        except (psycopg.OperationalError, psycopg.InterfaceError) as exc:
            reraise_if_cancelled()
            await asyncio.sleep(failures.failed(exc, expected=True))
        except Exception as exc:  # noqa: BLE001 - a router bug: route again after the backoff (clients retry)
            reraise_if_cancelled()
            await asyncio.sleep(failures.failed(exc, expected=False))
