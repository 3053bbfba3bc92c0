"""How the ledger is split into partitions: which partition a scope starts in, each partition's stream, and
the ledger's recorded partition count.

Why: one writer appends to one partition (its own gapless sequence, hash chain and stream), so several
writers can append at once. A scope lives in one partition for good, so its order, idempotency and
read-your-writes stay those of one writer. Its partition is recorded on its row when it is created; the
count is recorded once in `ledger_layout` and never changes under an existing ledger (a changed setting is
refused at start: a silent re-hash would send a scope's commands to a writer that does not hold its head).
"""

from __future__ import annotations

import hashlib
from typing import Any

import psycopg

from schemas.common import SYSTEM_SCOPE
from schemas.errors import PamledgerError


class PartitionCountChanged(PamledgerError):
    """The `partitions` setting disagrees with the count this ledger was made with (`invalid_request`)."""

    def __init__(self, recorded: int, wanted: int):
        self.recorded = recorded
        self.wanted = wanted
        super().__init__(
            f"this ledger was made with partitions={recorded}, the settings ask for partitions={wanted};"
            f" the count of an existing ledger cannot change (its scopes are assigned to partitions for good):"
            f" set PAMLEDGER_PARTITIONS={recorded}, or start a new ledger and `pamledger import` an export into it",
            details={"recorded_partitions": recorded, "partitions": wanted}, code="invalid_request")


def partition_of(scope_id: str, partitions: int) -> int:
    """The partition a new scope is assigned: the system scope's is 0, any other's a stable hash of its id
    (the first 8 bytes of its SHA-256) modulo the count. Pure: the same on every machine and release."""
    if partitions <= 1 or scope_id == SYSTEM_SCOPE:
        return 0
    return int.from_bytes(hashlib.sha256(scope_id.encode()).digest()[:8], "big") % partitions


def chosen_partitions(wanted: int | None, partitions: int) -> list[int]:
    """The partitions a per-partition command acts on (`replay`, `verify`, `stream rebuild`): `--partition N`,
    or every one; a partition the ledger does not have is `invalid_request`, never an empty one checked."""
    if wanted is not None and not 0 <= wanted < partitions:
        raise PamledgerError(f"--partition {wanted}: this ledger has partitions 0 to {partitions - 1}"
                             " (PAMLEDGER_PARTITIONS)", details={"partition": wanted, "partitions": partitions},
                             code="invalid_request")
    return list(range(partitions)) if wanted is None else [wanted]


def partition_stream(stream_name: str, partition: int) -> str:
    """The JetStream stream of one partition: partition 0's is the configured name (as with one partition),
    partition p's the name with `_P{p}` added (a stream's sequence is its partition's ledger sequence)."""
    return stream_name if partition == 0 else f"{stream_name}_P{partition}"


_RECORD_SQL = (
    "INSERT INTO ledger_layout (partitions) SELECT CASE WHEN EXISTS (SELECT 1 FROM ledger) THEN 1 ELSE %s END"
    " ON CONFLICT DO NOTHING")
_COUNT_SQL = "SELECT partitions FROM ledger_layout"


def recorded_partitions(conn: psycopg.Connection[Any], wanted: int) -> int:
    """The ledger's partition count, recorded now if it has none: `wanted` for an empty ledger, 1 for one that
    already holds rows (every ledger before partitions had one). Raises PartitionCountChanged when `wanted`
    differs from it."""
    conn.execute(_RECORD_SQL, (wanted,))
    row = conn.execute(_COUNT_SQL).fetchone()
    assert row is not None
    _refuse_another(int(row[0]), wanted)
    return wanted


async def recorded_partitions_async(conn: psycopg.AsyncConnection[Any], wanted: int) -> int:
    """recorded_partitions on an async connection."""
    await conn.execute(_RECORD_SQL, (wanted,))
    recorded = await recorded_count_async(conn)
    assert recorded is not None
    _refuse_another(recorded, wanted)
    return wanted


async def recorded_count_async(conn: psycopg.AsyncConnection[Any]) -> int | None:
    """The ledger's recorded partition count, None when no role has recorded one yet (read only)."""
    row = await (await conn.execute(_COUNT_SQL)).fetchone()
    return int(row[0]) if row else None


async def check_partition_count(conn: psycopg.AsyncConnection[Any], wanted: int) -> None:
    """Raise PartitionCountChanged when the ledger records another count than `wanted`; a ledger that records
    none yet agrees (only a writer records it). For every process and command that acts per partition: with
    a wrong count it would act on some partitions only, or on a partition that holds no scope."""
    _refuse_another(await recorded_count_async(conn), wanted)


def check_partition_count_at(database_url: str, wanted: int) -> None:
    """check_partition_count on a connection of its own (for commands before their event loop)."""
    with psycopg.connect(database_url, autocommit=True) as conn:
        row = conn.execute(_COUNT_SQL).fetchone()
    _refuse_another(int(row[0]) if row else None, wanted)



def _refuse_another(recorded: int | None, wanted: int) -> None:
    if recorded is not None and recorded != wanted:
        raise PartitionCountChanged(recorded, wanted)
