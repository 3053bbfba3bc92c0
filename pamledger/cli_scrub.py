"""`pamledger scrub`: the operator step that clears erased content from Postgres's own files.

Why it exists: an erasure (delete, erasing redaction) deletes the content rows, but Postgres deletes by
marking: the bytes stay in the table's pages (and the full-text index's) until VACUUM reclaims them, and in
the write-ahead log until its segments are recycled. Plain VACUUM frees the space for reuse without
rewriting the pages; VACUUM FULL writes each table anew and unlinks the old files, so the erased bytes are no
longer in any file Postgres keeps. CHECKPOINT then pg_switch_wal() then CHECKPOINT moves the redo point past
every segment that logged the erased rows, which Postgres then removes (or, with wal_recycle on, renames
for reuse and overwrites as the log moves on). docs/security.md "Erasure" says what stays out of reach
(replicas, WAL archives, base backups, the filesystem's free blocks).

VACUUM FULL holds an ACCESS EXCLUSIVE lock on each table while it rewrites it: the writer, the projector and
queries wait for that table meanwhile. `--no-full` runs a plain VACUUM instead (no such lock; the bytes may
stay in the pages until rows are written over them).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from typing import Any

import psycopg
from psycopg import sql

from authz.operator import require_operator
from infra.endpoints import resolve
from infra.settings import Settings
from pamledger_client.cli_common import progress_for
from pamledger_client.progress import ProgressReporter
from projector.replay import drop_leftovers

# Tables whose dead tuples can hold erased content or something derived from it (full-text lexemes, the
# idempotency records' request digests an erasure rewrote), in the order they are scrubbed; the embedding
# spaces' vector tables and kept replay tables are found at run time.
CONTENT_TABLES = ("content_store", "current_objects", "current_relationships", "index_outbox", "idempotency_records",
                  "vector_handoff")
_DERIVED = (
    "SELECT c.relname FROM pg_class c WHERE c.relkind = 'r' AND c.relnamespace = current_schema()::regnamespace"
    r" AND (c.relname LIKE 'embedding\_vectors\_%' OR c.relname LIKE 'current\_objects\_rebuild\_%'"
    r" OR c.relname LIKE 'current\_relationships\_rebuild\_%')"
    " ORDER BY c.relname"
)


def add_scrub_parser(sub: Any) -> None:
    scrub = sub.add_parser("scrub", help="after erasures: VACUUM FULL the content-bearing tables, CHECKPOINT and"
                                         " switch the WAL, so erased bytes leave Postgres's files (progress on"
                                         " stderr; locks each table while it is rewritten)")
    scrub.add_argument("--no-full", action="store_true",
                       help="plain VACUUM (no exclusive lock; erased bytes may stay in pages until overwritten)")


async def content_tables(conn: psycopg.AsyncConnection[Any]) -> list[str]:
    """The content-bearing tables that exist in this database, fixed ones first."""
    cur = await conn.execute("SELECT relname FROM pg_class WHERE relkind = 'r' AND relname = ANY(%s)"
                             " AND relnamespace = current_schema()::regnamespace", (list(CONTENT_TABLES),))
    present = {row[0] for row in await cur.fetchall()}
    derived = [row[0] for row in await (await conn.execute(_DERIVED)).fetchall()]
    return [t for t in CONTENT_TABLES if t in present] + derived


async def scrub(database_url: str, full: bool = True, progress: Any = None) -> dict[str, Any]:
    """Vacuum the content-bearing tables, then CHECKPOINT, switch the WAL segment and CHECKPOINT again."""
    progress = progress if progress is not None else ProgressReporter("scrub")
    started = time.perf_counter()
    async with await psycopg.AsyncConnection.connect(database_url, autocommit=True) as conn:
        # a replay killed midway leaves scratch tables (rebuilt rows, search vectors) holding live copies of
        # erased content: vacuuming would keep them, so they go first
        dropped = await drop_leftovers(conn)
        if dropped:
            progress({"phase": "drop_leftovers", "tables": dropped})
        tables = await content_tables(conn)
        for table in tables:
            progress({"phase": "vacuum", "table": table, "full": full})
            options = sql.SQL("(FULL, ANALYZE)" if full else "(ANALYZE)")
            await conn.execute(sql.SQL("VACUUM {} {}").format(options, sql.Identifier(table)))
        # ANALYZE (above) replaced the tables' planner statistics, which sample column values (a bytea's
        # histogram, a tsvector's most common lexemes); the rows it replaced, and those of dropped tables
        # (replay's scratch tables), are dead tuples of pg_statistic until it is vacuumed too.
        progress({"phase": "vacuum", "table": "pg_catalog.pg_statistic", "full": full})
        await conn.execute("VACUUM (FULL) pg_catalog.pg_statistic" if full else "VACUUM pg_catalog.pg_statistic")
        progress({"phase": "checkpoint"})
        await conn.execute("CHECKPOINT")
        progress({"phase": "switch_wal"})
        row = await (await conn.execute("SELECT pg_switch_wal()::text")).fetchone()
        await conn.execute("CHECKPOINT")  # the redo point passes the switched segment: it can go
        settings = await (await conn.execute(
            "SELECT name, setting FROM pg_settings WHERE name IN"
            " ('wal_recycle', 'archive_mode', 'wal_keep_size', 'wal_level')")).fetchall()
        slots = await (await conn.execute("SELECT count(*) FROM pg_replication_slots")).fetchone()
        superuser = await (await conn.execute("SELECT rolsuper FROM pg_roles WHERE rolname = current_user")).fetchone()
    found = {name: value for name, value in settings}
    notes = []
    if not (superuser and superuser[0]):
        notes.append("not a superuser: pg_statistic was skipped (Postgres warns and goes on); run scrub as a"
                     " superuser or a member of pg_maintain so sampled statistics of erased values go too")
    if found.get("wal_recycle") == "on":
        notes.append("wal_recycle is on: old WAL segments are renamed for reuse and their bytes overwritten as"
                     " the log moves on, not at once; set wal_recycle = off to have them deleted")
    if found.get("archive_mode", "off") != "off":
        notes.append("archive_mode is on: archived WAL segments keep the erased rows; expire them in the archive")
    if slots and slots[0]:
        notes.append(f"{slots[0]} replication slot(s): replicas and their WAL hold the rows until they replay"
                     " the deletions and run this step themselves")
    return {"vacuumed": [*tables, "pg_catalog.pg_statistic"], "dropped": dropped, "full": full, "checkpoint": True,
            "wal_switched": row[0] if row else None, "settings": found, "notes": notes,
            "seconds": round(time.perf_counter() - started, 3)}


def cmd_scrub(settings: Settings, args: argparse.Namespace) -> int:
    database_url = resolve(settings).database_url
    asyncio.run(require_operator(settings, database_url))
    progress = progress_for(args, "scrub")
    report = asyncio.run(scrub(database_url, full=not args.no_full, progress=progress))
    progress.finish()
    print(json.dumps(report, indent=2, sort_keys=True))
    return 0
