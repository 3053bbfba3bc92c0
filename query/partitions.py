"""Where a scope's reads wait: its partition, and that partition's projection and index checkpoints.

Why: with several partitions each has its own gapless sequence, so the `min_sequence` a client holds (the
last sequence it wrote) and an `as_of_sequence` are positions in its scope's partition: read-your-writes waits
on that partition's checkpoint, never on another's. With one partition nothing is looked up.
"""

from __future__ import annotations

from typing import Any, NamedTuple, TypeVar

import msgspec
from psycopg_pool import AsyncConnectionPool

from embedding.store import INDEX_CHECKPOINT, INDEX_NOTIFY_CHANNEL
from infra.ledger import ledger_head
from infra.lru import LRU
from infra.partitions import partition_of
from infra.projections import NOTIFY_CHANNEL, PROJECTION, partition_channel, partition_checkpoint
from infra.scopes import scope_partitions
from query.search import CheckpointWatcher

WithMin = TypeVar("WithMin", bound=msgspec.Struct)
CACHE_SIZE = 100_000  # scopes whose partition is remembered (a scope's partition never changes)


class Position(NamedTuple):
    """A scope's partition and the watchers of that partition's projection and index checkpoints."""

    partition: int
    watcher: CheckpointWatcher
    index_watcher: CheckpointWatcher


class ScopePositions:
    """The partition of each scope asked about (looked up once, then remembered) and every partition's watchers."""

    def __init__(self, partitions: int, positions: dict[int, Position]):
        self.partitions = partitions
        self.positions = positions
        self.known: LRU[str, int] = LRU(CACHE_SIZE)

    @classmethod
    def single(cls, partition: int, watcher: CheckpointWatcher, index_watcher: CheckpointWatcher) -> ScopePositions:
        """One partition: every scope's (nothing is looked up)."""
        return cls(1, {partition: Position(partition, watcher, index_watcher)})

    @classmethod
    def partitioned(cls, partitions: int) -> ScopePositions:
        """Several partitions, each with watchers of its own checkpoints (infra.projections.partition_checkpoint)."""
        return cls(partitions, {p: Position(p, CheckpointWatcher(partition_checkpoint(PROJECTION, p),
                                                                 partition_channel(NOTIFY_CHANNEL, p)),
                                            CheckpointWatcher(partition_checkpoint(INDEX_CHECKPOINT, p),
                                                              partition_channel(INDEX_NOTIFY_CHANNEL, p)))
                                for p in range(partitions)})

    def watchers(self) -> list[CheckpointWatcher]:
        """Every watcher, for the composition root to run."""
        return [w for position in self.positions.values() for w in (position.watcher, position.index_watcher)]

    async def of(self, pool: AsyncConnectionPool[Any], scope_id: str) -> Position:
        """The scope's position: its recorded partition's; a scope not created yet, its hashed one's."""
        if self.partitions == 1:
            return next(iter(self.positions.values()))
        partition = self.known.get(scope_id)
        if partition is None:
            async with pool.connection() as conn:
                found = (await scope_partitions(conn, [scope_id])).get(scope_id)
            if found is not None:
                self.known.put(scope_id, found)
            partition = found if found is not None else partition_of(scope_id, self.partitions)
        return self.positions[partition]

    async def reachable(self, pool: AsyncConnectionPool[Any], position: Position, request: WithMin) -> WithMin:
        """The request with its `min_sequence` no higher than its partition's ledger head. The SDK sends the
        last sequence it wrote in any scope, which with several partitions may be another partition's and
        beyond this one's head; every write of this scope is at or below its partition's head, so waiting for
        the head keeps read-your-writes and never waits for a position this partition has not reached."""
        wanted = getattr(request, "min_sequence", None)
        if self.partitions == 1 or wanted is None or wanted <= position.watcher.sequence:
            return request
        async with pool.connection() as conn:
            head = await ledger_head(conn, position.partition)
        return msgspec.structs.replace(request, min_sequence=head) if wanted > head else request
