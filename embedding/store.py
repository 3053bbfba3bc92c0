"""Where vectors live: the space registry rows and each space's own vector table (migration 008).

Why in the kernel: the indexer writes these tables, search reads them, the admin CLI reports them; none of
them may import another service for a table name or a row shape. Every statement that touches vectors names
exactly one space's table, so no query can compare vectors of two spaces.

A space's table is `embedding_vectors_<space_key>`: one row per (scope, object) holding the vector of one
version (`version_id`, `version_sequence`), with a `vector(<dimensions>)` column and one HNSW index (cosine).
A row is written only for a newer version than the one it holds (`upsert_vectors`), so a rebuild and the
live follower may write the same object in any order.

Beside it, each space keeps every vector it ever made, per version, in `embedding_vectors_<space_key>_kept`:
one row per (scope, object, content digest), written once and never changed (a re-embedding or a rebuild
leaves a kept row as it is), deleted only by an erasure of its object. The text embedded is a function of the
object type and the content (embedding.text_profile), so a vector per content digest is a vector per version;
search at a sealed snapshot ranks the versions at its watermark by these (query.snapshot_search), exactly, so
its answers stay the same bytes whatever the live table holds since. No HNSW index on it: a snapshot's search
compares every member's vector.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import psycopg
from psycopg import sql

from embedding.vector_wire import ensure_vector_adapters, vector_bytes
from schemas.common import SYSTEM_SCOPE
from schemas.embedding import EmbeddingSpace, decode_space

__all__ = ["SYSTEM_SCOPE"]  # re-exported: the services name the system scope through here or schemas.common

INDEX_CHECKPOINT = "indexer"
# A space's state as an SQL expression (one parameter: its id; NULL for an unknown space).
SPACE_STATE = "(SELECT state FROM embedding_spaces WHERE embedding_space_id = %s)"
INDEX_NOTIFY_CHANNEL = "pamledger_indexer"
HNSW_M = 16
HNSW_EF_CONSTRUCTION = 64


@dataclass(frozen=True)
class SpaceRow:
    """One registered space as the registry projection holds it."""

    embedding_space_id: str
    space_key: int
    descriptor: EmbeddingSpace
    space_digest: str
    dimensions: int
    registered_sequence: int
    state: str  # 'filling' (vectors of older versions may be missing) | 'ready'
    filled_sequence: int | None
    is_default: bool
    default_sequence: int | None

    @property
    def table(self) -> sql.Identifier:
        return vector_table(self.space_key)

    @property
    def kept_table(self) -> sql.Identifier:
        return kept_table(self.space_key)


@dataclass(frozen=True)
class VectorRow:
    """The vector of one object version in one space."""

    scope_id: str
    object_id: str
    version_id: str
    version_sequence: int
    ledger_sequence: int
    truncated: bool
    vector: Sequence[float]
    content_digest: str | None = None  # the content it was made from: a version with the same one only moves it


@dataclass(frozen=True)
class MovedRow:
    """A newer version of an object whose content (digest) its vector was already made from (a transition)."""

    scope_id: str
    object_id: str
    version_id: str
    version_sequence: int
    ledger_sequence: int
    content_digest: str


def vector_table(space_key: int) -> sql.Identifier:
    return sql.Identifier(f"embedding_vectors_{int(space_key)}")


def kept_table(space_key: int) -> sql.Identifier:
    """The space's vectors per version (the module docstring; infra/sql/020_kept_vectors.sql)."""
    return sql.Identifier(f"embedding_vectors_{int(space_key)}_kept")


def vector_literal(vector: Sequence[float]) -> str:
    """pgvector's text form. Refuses NaN and infinities, which no similarity can be computed from."""
    if not all(math.isfinite(x) for x in vector):
        raise ValueError("vector holds NaN or an infinite value")
    return "[" + ",".join(format(float(x), ".9g") for x in vector) + "]"


_SPACE_COLUMNS = ("embedding_space_id, space_key, descriptor, space_digest, dimensions, registered_sequence,"
                  " state, filled_sequence, is_default, default_sequence")


def _space(row: Any) -> SpaceRow:
    return SpaceRow(row[0], int(row[1]), decode_space(bytes(row[2])), row[3], int(row[4]), int(row[5]), row[6],
                    row[7], bool(row[8]), row[9])


async def list_spaces(conn: psycopg.AsyncConnection[Any]) -> list[SpaceRow]:
    cur = await conn.execute(f"SELECT {_SPACE_COLUMNS} FROM embedding_spaces ORDER BY space_key")
    return [_space(row) for row in await cur.fetchall()]


async def find_space(conn: psycopg.AsyncConnection[Any], embedding_space_id: str | None) -> SpaceRow | None:
    """The registered space with this id, or the default space when the id is None; None when there is none."""
    if embedding_space_id is None:
        cur = await conn.execute(f"SELECT {_SPACE_COLUMNS} FROM embedding_spaces WHERE is_default")
    else:
        cur = await conn.execute(f"SELECT {_SPACE_COLUMNS} FROM embedding_spaces WHERE embedding_space_id = %s",
                                 (embedding_space_id,))
    row = await cur.fetchone()
    return _space(row) if row else None


async def create_space(conn: psycopg.AsyncConnection[Any], space: EmbeddingSpace, encoded: bytes, digest: str,
                       registered_sequence: int) -> SpaceRow | None:
    """Project one registration: the registry row and the space's vector table with its HNSW index.

    The first registration of an id wins (the writer refuses another descriptor under a registered id, so a
    second one can only be the same); returns the row, or None when the id was already there."""
    cur = await conn.execute(
        "INSERT INTO embedding_spaces (embedding_space_id, space_key, descriptor, space_digest, dimensions,"
        " registered_sequence) VALUES (%s, (SELECT coalesce(max(space_key), 0) + 1 FROM embedding_spaces),"
        " %s, %s, %s, %s) ON CONFLICT (embedding_space_id) DO NOTHING RETURNING space_key",
        (space.embedding_space_id, encoded, digest, space.dimensions, registered_sequence))
    row = await cur.fetchone()
    if row is None:
        return None
    key = int(row[0])
    table = vector_table(key)
    await conn.execute(sql.SQL(
        "CREATE TABLE IF NOT EXISTS {} ("
        " scope_id text NOT NULL, object_id text NOT NULL, version_id text NOT NULL,"
        " version_sequence integer NOT NULL, ledger_sequence bigint NOT NULL, truncated boolean NOT NULL,"
        " content_digest text, embedding vector({}) NOT NULL, PRIMARY KEY (scope_id, object_id))"
    ).format(table, sql.Literal(space.dimensions)))
    await conn.execute(sql.SQL(
        "CREATE INDEX IF NOT EXISTS {} ON {} USING hnsw (embedding vector_cosine_ops) WITH (m = {}, ef_construction = {})"
    ).format(sql.Identifier(f"embedding_vectors_{key}_hnsw"), table, sql.Literal(HNSW_M),
             sql.Literal(HNSW_EF_CONSTRUCTION)))
    await conn.execute(sql.SQL(
        "CREATE TABLE IF NOT EXISTS {} ("
        " scope_id text NOT NULL, object_id text NOT NULL, content_digest text NOT NULL, version_id text NOT NULL,"
        " ledger_sequence bigint NOT NULL, embedding vector({}) NOT NULL,"
        " PRIMARY KEY (scope_id, object_id, content_digest))"
    ).format(kept_table(key), sql.Literal(space.dimensions)))
    return await find_space(conn, space.embedding_space_id)


async def upsert_vectors(conn: psycopg.AsyncConnection[Any], space: SpaceRow, rows: Sequence[VectorRow],
                         require_content: bool = False) -> None:
    """Write vectors, each only over an older version's (never back to an older one).

    `require_content` (a rebuild, which embeds outside the follower's order): write a row only while the
    version's content still exists, checked by the same statement, so a rebuild racing a delete cannot put an
    erased object's vector back (run it under `infra.locks.space_write_key`, which the follower's erasure takes too)."""
    if not rows:
        return
    guard = sql.SQL(
        " WHERE EXISTS (SELECT 1 FROM memory_versions v JOIN content_store c ON c.content_digest = v.content_digest"
        " WHERE v.version_id = r.version_id AND v.scope_id = r.scope_id AND v.object_id = r.object_id)"
    ) if require_content else sql.SQL("")
    statement = sql.SQL(
        "INSERT INTO {t} (scope_id, object_id, version_id, version_sequence, ledger_sequence, truncated,"
        " content_digest, embedding)"
        " SELECT r.scope_id, r.object_id, r.version_id, r.version_sequence, r.ledger_sequence, r.truncated,"
        " r.content_digest, r.embedding"
        " FROM unnest(%s::text[], %s::text[], %s::text[], %s::int[], %s::bigint[], %s::bool[], %s::text[],"
        " %b::vector[])"  # %b: vectors go in binary (embedding.vector_wire)
        " AS r(scope_id, object_id, version_id, version_sequence, ledger_sequence, truncated, content_digest,"
        " embedding)"
        "{guard}"
        " ON CONFLICT (scope_id, object_id) DO UPDATE SET version_id = excluded.version_id,"
        " version_sequence = excluded.version_sequence, ledger_sequence = excluded.ledger_sequence,"
        " truncated = excluded.truncated, content_digest = excluded.content_digest, embedding = excluded.embedding"
        " WHERE {t}.version_sequence < excluded.version_sequence"
    ).format(t=space.table, guard=guard)
    await ensure_vector_adapters(conn)
    await conn.execute(statement, (
        [r.scope_id for r in rows], [r.object_id for r in rows], [r.version_id for r in rows],
        [r.version_sequence for r in rows], [r.ledger_sequence for r in rows], [r.truncated for r in rows],
        [r.content_digest for r in rows], [vector_bytes(r.vector) for r in rows]))
    await keep_vectors(conn, space, rows, require_content)


async def keep_vectors(conn: psycopg.AsyncConnection[Any], space: SpaceRow, rows: Sequence[VectorRow],
                       require_content: bool = False) -> None:
    """Keep each row's vector for its (object, content digest), unless one is kept already: a kept vector is
    never replaced, so a re-embedding or a rebuild never changes what a sealed snapshot searched.
    `require_content` as for upsert_vectors (a rebuild racing an erasure keeps nothing of it)."""
    kept = [r for r in rows if r.content_digest is not None]
    if not kept:
        return
    guard = sql.SQL(
        " WHERE EXISTS (SELECT 1 FROM memory_versions v JOIN content_store c ON c.content_digest = v.content_digest"
        " WHERE v.version_id = r.version_id AND v.scope_id = r.scope_id AND v.object_id = r.object_id)"
    ) if require_content else sql.SQL("")
    await ensure_vector_adapters(conn)
    await conn.execute(sql.SQL(
        "INSERT INTO {t} (scope_id, object_id, content_digest, version_id, ledger_sequence, embedding)"
        " SELECT r.scope_id, r.object_id, r.content_digest, r.version_id, r.ledger_sequence, r.embedding"
        " FROM unnest(%s::text[], %s::text[], %s::text[], %s::text[], %s::bigint[], %b::vector[])"
        " AS r(scope_id, object_id, content_digest, version_id, ledger_sequence, embedding){guard}"
        " ON CONFLICT (scope_id, object_id, content_digest) DO NOTHING").format(t=space.kept_table, guard=guard), (
        [r.scope_id for r in kept], [r.object_id for r in kept], [r.content_digest for r in kept],
        [r.version_id for r in kept], [r.ledger_sequence for r in kept], [vector_bytes(r.vector) for r in kept]))


async def move_vectors(conn: psycopg.AsyncConnection[Any], space: SpaceRow, rows: Sequence[MovedRow]) -> None:
    """Let each object's vector name a newer version made of the same content, without embedding again.

    Only a row still holding that content and an older version moves: if a rebuild or an update changed the
    row meanwhile, the newer row stands."""
    if not rows:
        return
    await conn.execute(sql.SQL(
        "UPDATE {t} t SET version_id = r.version_id, version_sequence = r.version_sequence,"
        " ledger_sequence = r.ledger_sequence"
        " FROM unnest(%s::text[], %s::text[], %s::text[], %s::int[], %s::bigint[], %s::text[])"
        " AS r(scope_id, object_id, version_id, version_sequence, ledger_sequence, content_digest)"
        " WHERE t.scope_id = r.scope_id AND t.object_id = r.object_id AND t.content_digest = r.content_digest"
        " AND t.version_sequence < r.version_sequence").format(t=space.table), (
        [r.scope_id for r in rows], [r.object_id for r in rows], [r.version_id for r in rows],
        [r.version_sequence for r in rows], [r.ledger_sequence for r in rows], [r.content_digest for r in rows]))


async def vector_digests(conn: psycopg.AsyncConnection[Any], space: SpaceRow,
                         objects: Sequence[tuple[str, str]]) -> dict[tuple[str, str], str | None]:
    """The content digest each of these objects' vectors was made from (objects without a vector left out)."""
    if not objects:
        return {}
    cur = await conn.execute(sql.SQL(
        "SELECT t.scope_id, t.object_id, t.content_digest FROM {} t"
        " JOIN unnest(%s::text[], %s::text[]) AS d(scope_id, object_id)"
        " ON t.scope_id = d.scope_id AND t.object_id = d.object_id").format(space.table),
        ([o[0] for o in objects], [o[1] for o in objects]))
    return {(r[0], r[1]): r[2] for r in await cur.fetchall()}


async def version_vectors(conn: psycopg.AsyncConnection[Any], space: SpaceRow, scope_id: str,
                          versions: Sequence[tuple[str, str]]) -> list[tuple[str, str, str | None, str]]:
    """The vectors this space holds for exactly these (object_id, version_id) of the scope (an object whose
    vector names another version is left out), each as (object_id, version_id, content_digest, the vector in
    pgvector's text form: a JSON array of the float4 values, each in its shortest exact decimal)."""
    if not versions:
        return []
    cur = await conn.execute(sql.SQL(
        "SELECT t.object_id, t.version_id, t.content_digest, t.embedding::text FROM {} t"
        " JOIN unnest(%s::text[], %s::text[]) AS d(object_id, version_id)"
        " ON t.scope_id = %s AND t.object_id = d.object_id AND t.version_id = d.version_id"
        " ORDER BY t.object_id").format(space.table),
        ([v[0] for v in versions], [v[1] for v in versions], scope_id))
    return [(r[0], r[1], r[2], r[3]) for r in await cur.fetchall()]


async def make_default(conn: psycopg.AsyncConnection[Any], embedding_space_id: str, sequence: int) -> bool:
    """Project a `default_space_set` entry: this space becomes the only default. False (nothing changed) for
    an id nobody registered. Two statements in one transaction: the unique index allows one default."""
    cur = await conn.execute("SELECT 1 FROM embedding_spaces WHERE embedding_space_id = %s", (embedding_space_id,))
    if await cur.fetchone() is None:
        return False
    await conn.execute("UPDATE embedding_spaces SET is_default = false, default_sequence = NULL"
                       " WHERE is_default AND embedding_space_id <> %s", (embedding_space_id,))
    await conn.execute("UPDATE embedding_spaces SET is_default = true, default_sequence = %s"
                       " WHERE embedding_space_id = %s", (sequence, embedding_space_id))
    return True


async def mark_ready(conn: psycopg.AsyncConnection[Any], embedding_space_id: str, filled_sequence: int) -> None:
    """A fill finished: every current version up to `filled_sequence` has its vector (or has no text)."""
    await conn.execute("UPDATE embedding_spaces SET state = 'ready', filled_sequence = %s"
                       " WHERE embedding_space_id = %s", (filled_sequence, embedding_space_id))


async def delete_object_vectors(conn: psycopg.AsyncConnection[Any], spaces: Sequence[SpaceRow],
                                objects: Sequence[tuple[str, str]], kept: bool = False) -> None:
    """Remove every vector of these (scope_id, object_id) in every given space (erasure, or no text left);
    `kept` (an erasure): the vectors kept per version too, which hold the erased content as much as the live one."""
    if not objects:
        return
    scopes, ids = [o[0] for o in objects], [o[1] for o in objects]
    for space in spaces:
        for table in (space.table, space.kept_table) if kept else (space.table,):
            await conn.execute(sql.SQL(
                "DELETE FROM {} t USING unnest(%s::text[], %s::text[]) AS d(scope_id, object_id)"
                " WHERE t.scope_id = d.scope_id AND t.object_id = d.object_id").format(table), (scopes, ids))
