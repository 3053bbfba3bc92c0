"""Vectors an import hands to the indexer (migration 018): written by the writer with the imported entries,
taken by the indexer instead of embedding, deleted once the indexer is past them.

Why a table of its own and not the space's vector table: the writer must not write a derived index (the
indexer owns what a space's table holds, and in which order), yet the vectors must be there before the
indexer reads the imported entries, so they commit in the writer's transaction, beside those entries. A
row is a vector of one version's content in one space; it never outlives the indexer's pass over that
version: the indexer deletes every row of an object whose version at or after the row's it applied, and
every row of an object it erases, in the transaction that applies them (erasure reaches this table as it
reaches the vector tables).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import msgspec
import psycopg

from embedding.vector_wire import ensure_vector_adapters, vector_bytes
from schemas.embedding import HandedVector

_values = msgspec.json.Decoder(list[float]).decode  # pgvector's text form is a JSON array


async def hand_over(conn: psycopg.AsyncConnection[Any], rows: Sequence[HandedVector]) -> None:
    """Store vectors for the indexer (inside the writer's transaction); a later version's replaces an earlier's.
    Raises ValueError for a value no float4 holds (the writer's core refused those already)."""
    if not rows:
        return
    await ensure_vector_adapters(conn)
    await conn.execute(
        "INSERT INTO vector_handoff AS h (scope_id, object_id, embedding_space_id, space_digest, version_id,"
        " version_sequence, content_digest, embedding)"
        " SELECT * FROM unnest(%s::text[], %s::text[], %s::text[], %s::text[], %s::text[], %s::int[], %s::text[],"
        " %b::vector[])"
        " ON CONFLICT (scope_id, object_id, embedding_space_id) DO UPDATE SET space_digest = excluded.space_digest,"
        " version_id = excluded.version_id, version_sequence = excluded.version_sequence,"
        " content_digest = excluded.content_digest, embedding = excluded.embedding"
        " WHERE h.version_sequence < excluded.version_sequence",
        ([r.scope_id for r in rows], [r.object_id for r in rows], [r.embedding_space_id for r in rows],
         [r.space_digest for r in rows], [r.version_id for r in rows], [r.version_sequence for r in rows],
         [r.content_digest for r in rows], [vector_bytes(r.vector) for r in rows]))


async def handed_vectors(conn: psycopg.AsyncConnection[Any],
                         objects: Sequence[tuple[str, str]]) -> list[HandedVector]:
    """Every vector handed over for these (scope_id, object_id), in every space."""
    if not objects:
        return []
    cur = await conn.execute(
        "SELECT h.scope_id, h.object_id, h.embedding_space_id, h.space_digest, h.version_id, h.version_sequence,"
        " h.content_digest, h.embedding::text FROM vector_handoff h"
        " JOIN unnest(%s::text[], %s::text[]) AS d(scope_id, object_id)"
        " ON h.scope_id = d.scope_id AND h.object_id = d.object_id",
        ([o[0] for o in objects], [o[1] for o in objects]))
    return [HandedVector(scope_id=r[0], object_id=r[1], embedding_space_id=r[2], space_digest=r[3], version_id=r[4],
                         version_sequence=int(r[5]), content_digest=r[6], vector=tuple(_values(r[7])))
            for r in await cur.fetchall()]


async def drop_handed(conn: psycopg.AsyncConnection[Any], applied: Sequence[tuple[str, str, int]],
                      erased: Sequence[tuple[str, str]]) -> None:
    """Forget what the indexer is past: every object's vectors of a version at or before the one it applied
    (`applied`: scope_id, object_id, version sequence), and every vector of an object it erased."""
    if applied:
        await conn.execute(
            "DELETE FROM vector_handoff h"
            " USING unnest(%s::text[], %s::text[], %s::int[]) AS d(scope_id, object_id, seq)"
            " WHERE h.scope_id = d.scope_id AND h.object_id = d.object_id AND h.version_sequence <= d.seq",
            ([a[0] for a in applied], [a[1] for a in applied], [a[2] for a in applied]))
    if erased:
        await conn.execute(
            "DELETE FROM vector_handoff h USING unnest(%s::text[], %s::text[]) AS d(scope_id, object_id)"
            " WHERE h.scope_id = d.scope_id AND h.object_id = d.object_id",
            ([e[0] for e in erased], [e[1] for e in erased]))
