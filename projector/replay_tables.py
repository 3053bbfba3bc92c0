"""The tables replay rebuilds, and what it does with them: digests, row-by-row comparison with the live
table, the live table's indexes on a rebuild, and the swap (inside the caller's transaction, under the
projection's checkpoint lock). current_objects and current_relationships share all of it (`Projection`).
"""

from __future__ import annotations

import hashlib
import uuid
from dataclasses import dataclass
from typing import Any

import msgspec
import psycopg
from psycopg import sql

from infra.projections import PROJECTION
from infra.scopes import scopes_in_partitions
from projector.rows import COLUMNS, RELATIONSHIP_COLUMNS, Row
from projector.store import RELATIONSHIPS, comment_table
from schemas.canonical import canonical_bytes


@dataclass(frozen=True)
class Projection:
    """A projection table replay rebuilds: its live name and the id column of its primary key (after scope_id)."""

    live: str
    key: str

    def rebuild_name(self, suffix: str) -> str:
        return f"{self.live}_rebuild_{suffix}"


OBJECTS = Projection(PROJECTION, "object_id")
RELATIONSHIP_ROWS = Projection(RELATIONSHIPS, "relationship_id")  # rebuilt with the objects, same checkpoint
RELATIONSHIP_KEY = tuple(RELATIONSHIP_COLUMNS.index(c) for c in
                          ("scope_id", "relationship_id", "ledger_sequence", "content_digest", "meta"))


def relationship_digest(rows: list[Row]) -> tuple[str, int]:
    """`combined_digest` of relationship rows: the same row hash over (scope_id, relationship_id,
    ledger_sequence, content_digest, meta), so `projection_digest` of the table gives the same value."""
    a, b, c, d, e = RELATIONSHIP_KEY
    return combined_digest({(r[a], r[b]): row_hash(r[a], r[b], r[c], r[d], r[e]) for r in rows})


def selection(scope_id: str | None, partitions: tuple[int, ...] | None) -> sql.Composable:
    """The WHERE clause (or nothing) picking a rebuild's rows out of a projection or the content store: one
    scope's, the rows of the scopes created in `partitions` (None: every partition), or all."""
    if scope_id:
        return sql.SQL(" WHERE scope_id = {}").format(sql.Literal(scope_id))
    if partitions is None:
        return sql.SQL("")
    return sql.SQL(" WHERE scope_id IN ({})").format(scopes_in_partitions(list(partitions)))


async def compare(conn: psycopg.AsyncConnection[Any], table: str, where: sql.Composable | None,
                  spec: Projection = OBJECTS) -> dict[str, Any]:
    """Compare a rebuild with the rows of the live projection it stands for (`where`, from `selection`)."""
    live_scope = where or sql.SQL("")
    statement = sql.SQL(
        "SELECT coalesce(l.scope_id, r.scope_id), coalesce(l.{key}, r.{key}),"
        " l.{key} IS NULL, r.{key} IS NULL"
        " FROM (SELECT * FROM {live}{live_scope}) l FULL JOIN {rebuild} r ON"
        " l.scope_id = r.scope_id AND l.{key} = r.{key} WHERE l::text IS DISTINCT FROM r::text"
    ).format(key=sql.Identifier(spec.key), live=sql.Identifier(spec.live), live_scope=live_scope,
             rebuild=sql.Identifier(table))
    differing = await (await conn.execute(statement)).fetchall()
    live_digest, live_rows = await projection_digest(conn, spec.live, where, spec)
    return {
        "equal": not differing, "live_digest": live_digest, "live_rows": live_rows,
        "differences": len(differing),
        "first_differences": [
            {"scope_id": d[0], spec.key: d[1],
             "problem": "missing in live" if d[2] else "missing in rebuild" if d[3] else "rows differ"}
            for d in differing[:20]
        ],
    }


async def live_indexes(conn: psycopg.AsyncConnection[Any], spec: Projection = OBJECTS) -> list[tuple[str, str]]:
    """(suffix, definition) of every secondary index of the live table, so a rebuild gets the same ones."""
    cur = await conn.execute("SELECT indexname, indexdef FROM pg_indexes WHERE schemaname = current_schema()"
                             " AND tablename = %s AND indexname <> %s ORDER BY indexname",
                             (spec.live, f"{spec.live}_pkey"))
    return [(str(name).removeprefix(f"{spec.live}_"), str(definition)) for name, definition in await cur.fetchall()]


async def add_indexes(conn: psycopg.AsyncConnection[Any], table: str, spec: Projection = OBJECTS,
                 primary_key: bool = True) -> None:
    """The live table's primary key (unless the rebuild has it already) and secondary indexes, on `table`."""
    if primary_key:
        await conn.execute(sql.SQL("ALTER TABLE {} ADD PRIMARY KEY (scope_id, {})").format(
            sql.Identifier(table), sql.Identifier(spec.key)))
    for suffix, definition in await live_indexes(conn, spec):
        columns = definition[definition.index(" USING "):]
        await conn.execute(sql.SQL("CREATE INDEX {} ON {}" + columns).format(
            sql.Identifier(f"{table}_{suffix}"), sql.Identifier(table)))


async def swap_in(conn: psycopg.AsyncConnection[Any], table: str, spec: Projection = OBJECTS) -> None:
    """Replace the live table by the rebuild (inside the caller's transaction)."""
    indexes = await live_indexes(conn, spec)
    live = sql.Identifier(spec.live)
    retired = f"{spec.live}_retired_{uuid.uuid4().hex[:8]}"
    await conn.execute(sql.SQL("ALTER TABLE {} RENAME TO {}").format(live, sql.Identifier(retired)))
    await conn.execute(sql.SQL("ALTER TABLE {} RENAME TO {}").format(sql.Identifier(table), live))
    await conn.execute(sql.SQL("DROP TABLE {}").format(sql.Identifier(retired)))
    await comment_table(conn, spec.live, None)  # no longer scratch: the live projection
    await conn.execute(sql.SQL("ALTER TABLE {} RENAME CONSTRAINT {} TO {}").format(
        live, sql.Identifier(f"{table}_pkey"), sql.Identifier(f"{spec.live}_pkey")))
    for suffix, _ in indexes:
        await conn.execute(sql.SQL("ALTER INDEX {} RENAME TO {}").format(
            sql.Identifier(f"{table}_{suffix}"), sql.Identifier(f"{spec.live}_{suffix}")))


OBJECT_KEY = (COLUMNS.index("scope_id"), COLUMNS.index("object_id"), COLUMNS.index("ledger_sequence"),
        COLUMNS.index("content_digest"), COLUMNS.index("meta"))


def row_hash(scope_id: str, object_id: str, ledger_sequence: int, content_digest: str | None, meta: bytes) -> bytes:
    """sha256 of one row's digest line: canonical JSON `[scope_id, object_id, ledger_sequence,
    content_digest, meta]`. Every other column derives from these (meta is the canonical envelope; the
    full-text vector comes from the content the digest names)."""
    return hashlib.sha256(canonical_bytes([scope_id, object_id, ledger_sequence, content_digest,
                                           msgspec.Raw(meta)])).digest()


def combined_digest(row_hashes: dict[tuple[str, str], bytes]) -> tuple[str, int]:
    """The projection digest: sha256 over the rows' `row_hash`es in (scope_id, object_id) code-point order,
    and the row count. Equal digests mean equal projections; `--verify` still compares every column."""
    digest = hashlib.sha256()
    for key in sorted(row_hashes):
        digest.update(row_hashes[key])
    return "sha256:" + digest.hexdigest(), len(row_hashes)


async def projection_digest(conn: psycopg.AsyncConnection[Any], table: str, where: sql.Composable | None,
                            spec: Projection = OBJECTS) -> tuple[str, int]:
    """`combined_digest` of a projection table (or the rows `where` picks, from `selection`); `spec` says which
    kind of rows it holds."""
    scope = where or sql.SQL("")
    statement = sql.SQL("COPY (SELECT scope_id, {}, ledger_sequence, content_digest, meta FROM {}{})"
                        " TO STDOUT (FORMAT BINARY)").format(sql.Identifier(spec.key), sql.Identifier(table), scope)
    row_hashes: dict[tuple[str, str], bytes] = {}
    cur = conn.cursor()
    async with cur.copy(statement) as copy:
        copy.set_types(["text", "text", "int8", "text", "bytea"])
        async for scope, object_id, ledger_sequence, content_digest, meta in copy.rows():
            row_hashes[(scope, object_id)] = row_hash(scope, object_id, ledger_sequence, content_digest, meta)
    return combined_digest(row_hashes)
