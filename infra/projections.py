"""The projection tables' names and shapes, and the checkpoint read: what readers of a projection share.

Why in the kernel: the projector writes `current_objects` and its checkpoint, the query service reads
both (and waits on the notify channel for read-your-writes), the CLI's status reports the checkpoint;
none of them may import another service for a table name.
"""

from __future__ import annotations

from typing import Any

import psycopg

PROJECTION = "current_objects"
# A follower's checkpoint as an SQL expression (one parameter: its name; 0 before its first batch), for
# statements that read it beside other positions in one round trip.
CHECKPOINT = "coalesce((SELECT ledger_sequence FROM projection_checkpoints WHERE projection = %s), 0)"
NOTIFY_CHANNEL = "pamledger_projection"
# Which content counts for full text: every JSON string value in canonical_content, recursively (keys,
# numbers, booleans and null are not indexed), with the 'english' configuration. Content that was erased
# (delete, redaction) has no row in content_store, so its vector is NULL.
SEARCH_EXPRESSION = (
    "CASE WHEN c.content IS NULL THEN NULL"
    " ELSE jsonb_to_tsvector('english', convert_from(c.content, 'UTF8')::jsonb, '[\"string\"]') END"
)


def partition_checkpoint(name: str, partition: int) -> str:
    """The checkpoint row of a follower (or projection) `name` in `partition`: its name in partition 0 (as with
    one partition), `name.p<partition>` in the others."""
    return name if partition == 0 else f"{name}.p{partition}"


def partition_channel(channel: str, partition: int) -> str:
    """The notify channel a follower's commits in `partition` send on (partition_checkpoint's counterpart)."""
    return channel if partition == 0 else f"{channel}_p{partition}"


async def advance_checkpoint(conn: psycopg.AsyncConnection[Any], projection: str, through: int,
                             partition: int = 0) -> None:
    """Create, lock and advance `projection`'s checkpoint row (never backwards), before any row it covers
    is touched: a concurrent `replay --swap` and the follower never interleave. A new row carries the ledger
    id of the partition it follows (the column's default is partition 0's: migration 007 predates partitions)."""
    await conn.execute(
        b"INSERT INTO projection_checkpoints (projection, ledger_sequence, ledger_id)"
        b" VALUES (%s, %s, pamledger_ledger_id(%s)) ON CONFLICT (projection) DO UPDATE"
        b" SET ledger_sequence = greatest(projection_checkpoints.ledger_sequence, excluded.ledger_sequence)",
        (projection, through, partition))


async def notify_checkpoint(conn: psycopg.AsyncConnection[Any], channel: str, through: int) -> None:
    """Tell `channel`'s listeners (read-your-writes waiters) the checkpoint reached `through`: sent at COMMIT."""
    await conn.execute(b"SELECT pg_notify(%s, %s)", (channel, str(through)))


async def checkpoint(conn: psycopg.AsyncConnection[Any], projection: str = PROJECTION) -> int:
    """How far the projection has applied the ledger (0 before its first batch)."""
    row = await (await conn.execute(f"SELECT {CHECKPOINT}", (projection,))).fetchone()
    return int(row[0]) if row else 0
