"""The command router of a ledger of several partitions: each command on `{prefix}.cmd.<name>` goes to the
writer of its scope's partition.

Why one router, in the process that leads partition 0: clients (the SDK, the CLI, other languages) keep
sending every command to `{prefix}.cmd.<name>` and need not know the partition count. One subscriber keeps
today's order: commands one connection sends reach each partition's writer in the order they were sent.
A scope's partition is the one recorded on its row (infra.partitions: the scope keeps it); a scope not yet
created is sent to the partition its id hashes to, where its writer creates it (or answers
scope_not_found). Commands of a partition this process leads go straight into that writer's inbox; the
others are published to `{prefix}.cmd.p<partition>.<name>` with their reply subject and headers unchanged,
so the partition's writer answers the client directly.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from typing import Any

import msgspec
import psycopg
import structlog

from command_handler.writer import Command
from infra.lru import LRU
from infra.nats_raw import RawClient, parse_headers
from infra.partitions import partition_of
from infra.scopes import scope_partitions
from pamledger_client.protocol.subjects import command_subject, partition_command_subject
from schemas.errors import ServiceUnavailable
from schemas.replies import OPERATION_HEADER, error_reply

log = structlog.get_logger(__name__)
CACHE_SIZE = 100_000  # scopes whose partition is remembered (a scope's partition never changes)


class _Scoped(msgspec.Struct):
    """The one field the router reads of any command."""

    scope_id: str | None = None


_scoped = msgspec.json.Decoder(_Scoped)


def scope_of(data: bytes) -> str | None:
    """The scope a command names (None: not a JSON object with a string scope_id; its writer refuses it)."""
    try:
        return _scoped.decode(data).scope_id
    except (msgspec.DecodeError, msgspec.ValidationError):
        return None


class Router:
    """Routes `{prefix}.cmd.*` to the partitions' writers while this process leads partition 0."""

    def __init__(self, nc: RawClient, conn: psycopg.AsyncConnection[Any], prefix: str, partitions: int,
                 local: dict[int, Callable[[Command], None]]):
        self.nc = nc
        self.conn = conn  # a connection of the router's own: the writers' are inside their transactions
        self.prefix = prefix
        self.partitions = partitions
        self.local = local
        self.known: LRU[str, int] = LRU(CACHE_SIZE)
        self.queue: asyncio.Queue[Command] = asyncio.Queue()
        self.routed = 0

    async def serve(self) -> None:
        """Subscribe, then route in arrival order until cancelled."""
        sub = await self.nc.subscribe_raw(command_subject(self.prefix, "*"), self._on_command, queue="pamledger-writer")
        await self.nc.flush()
        log.info("router.serving", partitions=self.partitions)
        try:
            while True:
                batch = [await self.queue.get()]
                while not self.queue.empty():
                    batch.append(self.queue.get_nowait())
                await self._route(batch)
        finally:
            with contextlib.suppress(Exception):  # stopping with NATS gone: nothing to unsubscribe from
                await self.nc.unsubscribe_raw(sub)

    def _on_command(self, subject: bytes, reply: bytes, data: bytes, headers: bytes | None) -> None:
        self.queue.put_nowait(Command(subject.decode(), reply.decode(), data, parse_headers(headers)))

    async def _route(self, batch: list[Command]) -> None:
        """Look up, in one query, the scopes of the batch not remembered, then hand each command on in order."""
        scopes = [scope_of(c.data) for c in batch]
        missing = sorted({s for s in scopes if s is not None and s not in self.known})
        try:
            found = await scope_partitions(self.conn, missing) if missing else {}
        except psycopg.Error:
            await self._unavailable(batch)  # answered, not dropped; the router reconnects (writer_role)
            raise
        for scope_id, partition in found.items():
            self.known.put(scope_id, partition)
        for command, scope in zip(batch, scopes):
            partition = self._partition(scope)
            deliver = self.local.get(partition)
            if deliver is not None:
                deliver(command)
            else:
                name = command.subject.rsplit(".", 1)[-1]
                await self.nc.publish(partition_command_subject(self.prefix, partition, name), command.data,
                                      reply=command.reply, headers=command.headers)
            self.routed += 1

    async def _unavailable(self, batch: list[Command]) -> None:
        """Answer every command of the batch service_unavailable (retryable): nothing of it was routed."""
        error = ServiceUnavailable("the command router cannot read the scope registry; retry")
        for command in batch:
            if command.reply:
                with contextlib.suppress(Exception):
                    await self.nc.publish(command.reply, error_reply(
                        error, (command.headers or {}).get(OPERATION_HEADER)))

    def _partition(self, scope_id: str | None) -> int:
        if scope_id is None:
            return 0  # the partition 0 writer answers invalid_request
        recorded = self.known.get(scope_id)
        # Not created yet: its writer-to-be. Not remembered, so the scope's recorded partition is read again
        # once it exists (an evaluation scope is created in its snapshot's partition, not its hash's).
        return recorded if recorded is not None else partition_of(scope_id, self.partitions)
