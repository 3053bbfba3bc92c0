"""What `pamledger spaces` and `pamledger status` say about the spaces: state, counts, freshness.

Why counts of stale and missing vectors: a vector always names the version it was made from, so a vector
older than its object's current version is stale (reported until replaced), and a current version without a
vector is missing (a space still filling, an embedder this build lacks, or an object with no text).
"""

from __future__ import annotations

from typing import Any

import msgspec
import psycopg
from psycopg import sql

from embedding.embedders import hashing_space, minilm_space
from embedding.store import INDEX_CHECKPOINT, SpaceRow, list_spaces
from indexer.catalog import MISSING_SQL, STALE_SQL
from infra.ledger import ledger_head
from infra.projections import checkpoint
from schemas.embedding import same_space


def can_embed(space: SpaceRow) -> bool:
    """Whether this build has the space's embedder (without loading a model to find out)."""
    d = space.descriptor
    return same_space(d, minilm_space()) or (d.dimensions <= 2000 and same_space(d, hashing_space(d.dimensions)))


async def _count(conn: psycopg.AsyncConnection[Any], query: sql.Composed) -> int:
    row = await (await conn.execute(query)).fetchone()
    return int(row[0]) if row else 0


async def space_counts(conn: psycopg.AsyncConnection[Any], space: SpaceRow) -> dict[str, int]:
    t = space.table
    return {
        "vectors": await _count(conn, sql.SQL("SELECT count(*) FROM {}").format(t)),
        "stale": await _count(conn, sql.SQL(STALE_SQL).format(t)),
        "missing": await _count(conn, sql.SQL(MISSING_SQL).format(t)),
    }


async def spaces_report(conn: psycopg.AsyncConnection[Any], partition: int, counts: bool = True) -> dict[str, Any]:
    """Every registered space with its descriptor, key, state, default flag, (counts) and the indexer's
    position: its checkpoint and backlog (ledger head − checkpoint), which every space shares while live."""
    head = await ledger_head(conn, partition)
    indexed = await checkpoint(conn, INDEX_CHECKPOINT)
    spaces = []
    for space in await list_spaces(conn):
        item: dict[str, Any] = {
            "embedding_space_id": space.embedding_space_id, "space_key": space.space_key, "state": space.state,
            "default": space.is_default, "space_digest": space.space_digest,
            "descriptor": msgspec.to_builtins(space.descriptor), "registered_sequence": space.registered_sequence,
            "filled_sequence": space.filled_sequence, "default_sequence": space.default_sequence,
            "embedder": "available" if can_embed(space) else "unavailable",
            "backlog": head - indexed if can_embed(space) else None,
        }
        if counts:
            item.update(await space_counts(conn, space))
        spaces.append(item)
    return {"ledger_sequence": head, "indexer_checkpoint": indexed, "backlog": head - indexed, "spaces": spaces}
