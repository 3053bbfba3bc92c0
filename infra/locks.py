"""Every Postgres advisory-lock key pamledger takes, defined here once.

A key is a bigint: 'pam' and one letter naming what it guards, then a partition (the leadership locks of the
writer, the followers, retention and the gateway) or a space key (a space's fill and write locks). The values
are those every release so far has used: two releases of pamledger on one database during an upgrade take
the same locks, so they never both lead.

The ranges are disjoint while the partition stays below MAX_PARTITIONS: the writer's range ('pam' then a
zero byte, plus the partition) would reach the migration lock ('pamm') at partition 0x6D. The settings bound
`partition` to it, and tests/unit/test_locks.py checks every pair of ranges. Partitions past 108 ([X1]) need
a second key space (the two-int form of pg_advisory_lock), not bigger offsets.
"""

from __future__ import annotations

MAX_PARTITIONS = 0x6D  # 109: partitions 0..108
MAX_SPACE_KEY = 1 << 24

WRITER_BASE = 0x70616D00  # 'pam\0'
MIGRATION = 0x70616D6D  # 'pamm', session lock while migrating
INDEXER_BASE = 0x70616D69_00  # 'pami'
PROJECTOR_BASE = 0x70616D70_00  # 'pamp'
RETENTION_BASE = 0x70616D72_00  # 'pamr'
GATEWAY_BASE = 0x70616D73_00  # 'pams'
SPACE_WRITE_BASE = 0x70616D65_00_0000  # 'pame', per space: a rebuild batch and the follower's erasure
SPACE_FILL_BASE = 0x70616D66_00_0000  # 'pamf', per space: one fill at a time

PARTITIONED_BASES = {"writer": WRITER_BASE, "indexer": INDEXER_BASE, "projector": PROJECTOR_BASE,
                     "retention": RETENTION_BASE, "gateway": GATEWAY_BASE}


def partition_key(base: int, partition: int) -> int:
    """A leadership lock: `base` plus the partition (ValueError outside 0..MAX_PARTITIONS-1)."""
    if not 0 <= partition < MAX_PARTITIONS:
        raise ValueError(f"partition {partition} is outside 0..{MAX_PARTITIONS - 1}")
    return base + partition


def writer_key(partition: int) -> int:
    return partition_key(WRITER_BASE, partition)


def retention_key(partition: int) -> int:
    return partition_key(RETENTION_BASE, partition)


def gateway_key(partition: int) -> int:
    return partition_key(GATEWAY_BASE, partition)


def _space_key(base: int, space_key: int) -> int:
    if not 0 <= int(space_key) < MAX_SPACE_KEY:
        raise ValueError(f"space key {space_key} is outside 0..{MAX_SPACE_KEY - 1}")
    return base + int(space_key)


def space_fill_key(space_key: int) -> int:
    """The session-level lock a fill holds for its whole run: one fill of a space at a time."""
    return _space_key(SPACE_FILL_BASE, space_key)


def space_write_key(space_key: int) -> int:
    """The transaction-level lock a rebuild batch and the follower's erasure both take for a space."""
    return _space_key(SPACE_WRITE_BASE, space_key)
