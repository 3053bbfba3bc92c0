"""Writing projection rows: staged with COPY, merged with the full-text vector, checkpoint in the same txn;
relationship rows (current_relationships) beside them in the same transaction.

SQL lives here, next to the adapter that runs it. Table names go through psycopg.sql only.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import AsyncIterator
from typing import Any

import msgspec
import psycopg
from psycopg import sql

from infra.pg_pipeline import pipelined_transaction
from infra.projections import NOTIFY_CHANNEL, PROJECTION, SEARCH_EXPRESSION, advance_checkpoint, notify_checkpoint
from projector.rows import COLUMNS, RELATIONSHIP_COLUMNS, Row

_STAGE = "projection_stage"
_json = msgspec.json.Encoder()
SMALL_BATCH = 1000  # up to this many rows (every live batch): one JSON-parameter statement; more: COPY stage
COLUMN_TYPES = ("text", "text", "text", "int4", "int8", "text", "text", "text", "text", "text", "text", "text",
                "text", "timestamptz", "timestamptz", "timestamptz", "timestamptz", "timestamptz", "timestamptz",
                "text", "bytea")


async def apply_rows(conn: psycopg.AsyncConnection[Any], rows: list[Row], through: int,
                     table: str = PROJECTION, small_batch: int = SMALL_BATCH) -> None:
    """Upsert rows (at most one per object) and move the checkpoint to `through`, in one transaction.

    The checkpoint row is locked first, so a concurrent swap by `replay --swap` and this projector never
    interleave. A row never replaces a newer one, so a redelivered event changes nothing. Small batches
    (up to `small_batch` rows: live traffic) go as one statement over a JSON parameter, with BEGIN, the
    checkpoint, the NOTIFY and COMMIT in one pipeline (one round trip; the connection must be in autocommit
    mode); large ones through a COPY stage, which cannot be pipelined.
    """
    if len(rows) <= small_batch:
        async with pipelined_transaction(conn):
            await advance_checkpoint(conn, PROJECTION, through)
            if rows:
                await upsert_rows(conn, rows, table)
            await notify_checkpoint(conn, NOTIFY_CHANNEL, through)  # sent at COMMIT
        return
    async with conn.transaction():
        async with conn.pipeline():
            await advance_checkpoint(conn, PROJECTION, through)
            await notify_checkpoint(conn, NOTIFY_CHANNEL, through)
        await stage_and_merge(conn, rows, table, upsert=True)


async def upsert_rows(conn: psycopg.AsyncConnection[Any], rows: list[Row], table: str = PROJECTION) -> None:
    """The live batch's one statement: rows as a JSON parameter, search vectors from the content store."""
    await conn.execute(_json_insert(table), (_rows_json(rows),))


def _rows_json(rows: list[Row]) -> str:
    """Rows as ONE JSON parameter: psycopg dumps one string far faster than 21 arrays. `meta` (canonical
    JSON, so valid UTF-8) travels as a JSON string and is stored as its UTF-8 bytes, exactly the
    event's: half the size of hex, and cheaper for Postgres to read than a nested JSON value."""
    return _json.encode([{**dict(zip(COLUMNS[:-1], row[:-1])), "meta": row[-1].decode()} for row in rows]).decode()


@functools.lru_cache(maxsize=8)
def _json_insert(table: str) -> bytes:
    """INSERT ... SELECT FROM json_to_recordset(the rows): content looked up by its key, no stage. As
    bytes, composed once: psycopg would otherwise re-compose a sql.Composed on every execution."""
    record = sql.SQL(", ").join(
        sql.SQL("{} {}").format(sql.Identifier(c), sql.SQL("text" if c == "meta" else kind))
        for c, kind in zip(COLUMNS, COLUMN_TYPES))
    source = sql.SQL("json_to_recordset(%s::json) AS s({record})").format(record=record)
    return _insert(table, source, sql.SQL(SEARCH_EXPRESSION), sql.Identifier("content_store"), upsert=True,
                   meta=sql.SQL("convert_to(s.meta, 'UTF8')")).as_bytes(None)


def _insert(table: str, source: sql.Composable, search: sql.Composable, content: sql.Composable,
            upsert: bool, meta: sql.Composable | None = None) -> sql.Composed:
    columns = sql.SQL(", ").join(sql.Identifier(c) for c in COLUMNS)
    selected = sql.SQL(", ").join(
        meta if c == "meta" and meta is not None else sql.SQL("s.{}").format(sql.Identifier(c)) for c in COLUMNS)
    statement = sql.SQL(
        "INSERT INTO {table} ({columns}, search) SELECT {selected}, {search}"
        " FROM {source} LEFT JOIN {content} c ON c.content_digest = s.content_digest"
    ).format(table=sql.Identifier(table), columns=columns, selected=selected, search=search, source=source,
             content=content)
    if upsert:
        updates = sql.SQL(", ").join(
            sql.SQL("{c} = excluded.{c}").format(c=sql.Identifier(c)) for c in (*COLUMNS[2:], "search"))
        statement = statement + sql.SQL(
            " ON CONFLICT (scope_id, object_id) DO UPDATE SET {updates}"
            " WHERE {table}.ledger_sequence < excluded.ledger_sequence"
        ).format(updates=updates, table=sql.Identifier(table))
    return statement


async def precompute_search(conn: psycopg.AsyncConnection[Any], table: str, where: sql.Composable,
                            comment: str) -> None:
    """(content_digest, search) of the content store (the rows `where` picks by scope_id, or all) into a new
    unlogged `table`, so a bulk rebuild can compute vectors on another connection while it reads the ledger.
    The table appears with `comment` (its owner), never without."""
    async with conn.transaction():
        await conn.execute(sql.SQL("CREATE UNLOGGED TABLE {} AS SELECT c.content_digest, " + SEARCH_EXPRESSION +
                                   " AS search FROM content_store c{}").format(sql.Identifier(table), where))
        await comment_table(conn, table, comment)
    await conn.execute(sql.SQL("ANALYZE {}").format(sql.Identifier(table)))


async def comment_table(conn: psycopg.AsyncConnection[Any], table: str, comment: str | None) -> None:
    """Set (or, with None, clear) a table's comment: how replay marks who owns a scratch table."""
    await conn.execute(sql.SQL("COMMENT ON TABLE {} IS {}").format(sql.Identifier(table), sql.Literal(comment)))


async def drop_table(conn: psycopg.AsyncConnection[Any], table: str) -> None:
    await conn.execute(sql.SQL("DROP TABLE IF EXISTS {}").format(sql.Identifier(table)))


async def stage_and_merge(conn: psycopg.AsyncConnection[Any], rows: list[Row], table: str, upsert: bool,
                          search_table: str | None = None) -> None:
    """COPY rows into a temp stage, then insert them into `table` with their search vectors (computed
    from the content store, or taken from a `precompute_search` table). Call inside a transaction."""
    await stage(conn, rows)
    await merge(conn, table, upsert, search_table)


async def stage(conn: psycopg.AsyncConnection[Any], rows: list[Row]) -> None:
    """COPY rows into this connection's temp stage (emptied at COMMIT)."""
    async with staging(conn) as copy:
        for row in rows:
            await copy.write_row(row)


@contextlib.asynccontextmanager
async def staging(conn: psycopg.AsyncConnection[Any]) -> AsyncIterator[psycopg.AsyncCopy]:
    """A COPY into this connection's temp stage (emptied at COMMIT), for rows written one by one as they
    are found (`copy.write_row`); `merge` then moves them into a projection table."""
    await conn.execute(sql.SQL(
        "CREATE TEMP TABLE IF NOT EXISTS {stage} (LIKE current_objects EXCLUDING ALL) ON COMMIT DELETE ROWS"
    ).format(stage=sql.Identifier(_STAGE)))
    columns = sql.SQL(", ").join(sql.Identifier(c) for c in COLUMNS)
    async with conn.cursor().copy(sql.SQL("COPY {stage} ({columns}) FROM STDIN").format(
            stage=sql.Identifier(_STAGE), columns=columns)) as copy:
        yield copy


async def merge(conn: psycopg.AsyncConnection[Any], table: str, upsert: bool, search_table: str | None = None) -> None:
    """Insert the staged rows into `table` with their search vectors, then empty the stage."""
    cur = conn.cursor()
    # Without statistics the planner guesses the stage's size and may hash-join the WHOLE content store;
    # with them, small batches use its primary key and bulk replays a hash join.
    await cur.execute(sql.SQL("ANALYZE {stage}").format(stage=sql.Identifier(_STAGE)))
    if search_table is None:
        search, content = sql.SQL(SEARCH_EXPRESSION), sql.Identifier("content_store")
    else:
        search, content = sql.SQL("c.search"), sql.Identifier(search_table)
    source = sql.SQL("{stage} s").format(stage=sql.Identifier(_STAGE))
    await cur.execute(_insert(table, source, search, content, upsert))
    await cur.execute(sql.SQL("TRUNCATE {stage}").format(stage=sql.Identifier(_STAGE)))


RELATIONSHIPS = "current_relationships"
RELATIONSHIP_TYPES = ("text", "text", "text", "int4", "int8", "text", "text", "text", "text", "text", "text", "text",
                      "text", "text", "text", "timestamptz", "text", "bytea")


async def upsert_relationships(conn: psycopg.AsyncConnection[Any], rows: list[Row], table: str = RELATIONSHIPS) -> None:
    """Relationship rows (at most one per relationship) in one statement over a JSON parameter, as
    `upsert_rows` writes objects: a row never replaces a newer one, so redelivery changes nothing."""
    payload = _json.encode([{**dict(zip(RELATIONSHIP_COLUMNS[:-1], row[:-1])), "meta": row[-1].decode()}
                            for row in rows]).decode()
    await conn.execute(_relationship_insert(table), (payload,))


@functools.lru_cache(maxsize=8)
def _relationship_insert(table: str) -> bytes:
    record = sql.SQL(", ").join(
        sql.SQL("{} {}").format(sql.Identifier(c), sql.SQL("text" if c == "meta" else kind))
        for c, kind in zip(RELATIONSHIP_COLUMNS, RELATIONSHIP_TYPES))
    columns = sql.SQL(", ").join(sql.Identifier(c) for c in RELATIONSHIP_COLUMNS)
    selected = sql.SQL(", ").join(
        sql.SQL("convert_to(s.meta, 'UTF8')") if c == "meta" else sql.SQL("s.{}").format(sql.Identifier(c))
        for c in RELATIONSHIP_COLUMNS)
    updates = sql.SQL(", ").join(
        sql.SQL("{c} = excluded.{c}").format(c=sql.Identifier(c)) for c in RELATIONSHIP_COLUMNS[2:])
    return sql.SQL(
        "INSERT INTO {table} ({columns}) SELECT {selected} FROM json_to_recordset(%s::json) AS s({record})"
        " ON CONFLICT (scope_id, relationship_id) DO UPDATE SET {updates}"
        " WHERE {table}.ledger_sequence < excluded.ledger_sequence"
    ).format(table=sql.Identifier(table), columns=columns, selected=selected, record=record,
             updates=updates).as_bytes(None)
