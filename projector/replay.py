"""Rebuild the current-version projection (current_objects, and current_relationships beside it) from the
Postgres ledger alone, for audits and repairs.

`replay` folds ledger events (newest first, optionally one scope, optionally up to a sequence) into a
fresh table with the same pure projection the live projector uses, prints a digest of the result and can
compare it with the live table or swap it in. Comparing and swapping happen under the projection's
checkpoint lock: the live projector pauses for that moment (its next batch then lands in whichever table
is current), while Query keeps answering.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import msgspec
import psycopg
from psycopg import sql

from infra.ledger import ledger_head
from infra.ledger_identity import ledger_identity
from infra.projections import PROJECTION, advance_checkpoint, partition_checkpoint
from pamledger_client.protocol.tasks import stop_task
from projector.replay_diagnosis import DATA_ERRORS, replay_failed
from projector.replay_tables import (OBJECT_KEY, OBJECTS, RELATIONSHIP_ROWS, add_indexes, combined_digest, compare,
                                     projection_digest, relationship_digest, row_hash, selection, swap_in)
from projector.rows import Row, newest_projection
from projector.store import (RELATIONSHIPS, comment_table, drop_table, merge, precompute_search, staging,
                             upsert_relationships)

__all__ = ["KEPT_MARK", "ReplayOptions", "drop_leftovers", "projection_digest", "replay", "RELATIONSHIP_ROWS"]

Progress = Callable[[dict[str, Any]], None]


_RELATIONSHIP_CHUNK = 1000  # relationship rows per statement into the rebuild


class ReplayOptions(msgspec.Struct, frozen=True, kw_only=True):
    scope_id: str | None = None
    to_sequence: int | None = None
    verify: bool = False
    swap: bool = False
    keep: bool = False
    # The ledger partitions whose events are folded, and how many the ledger has: a rebuild of fewer than all
    # holds (digests, compares) the rows of their scopes only, and cannot replace the live projection.
    partitions: tuple[int, ...] = (0,)
    ledger_partitions: int = 1

    @property
    def whole(self) -> bool:
        """Every partition of the ledger is rebuilt: the rebuild can stand for the whole live projection."""
        return set(self.partitions) == set(range(self.ledger_partitions))

    def rows(self) -> sql.Composable:
        """The WHERE clause (or nothing) that picks the rebuild's rows out of a projection table."""
        return selection(self.scope_id, None if self.whole else self.partitions)


async def replay(database_url: str, options: ReplayOptions, progress: Progress | None = None) -> dict[str, Any]:
    """Rebuild into a fresh table; returns the report (`digest`, counts, rate, and the verify outcome).
    Raises ReplayFailed naming the ledger sequence when a stored event cannot be projected."""
    try:
        return await _replay(database_url, options, progress)
    except DATA_ERRORS as exc:
        raise await replay_failed(database_url, options.partitions, options.scope_id, options.to_sequence, exc) from exc


async def _replay(database_url: str, options: ReplayOptions, progress: Progress | None) -> dict[str, Any]:
    if options.swap and (options.scope_id or options.to_sequence):
        raise ValueError("--swap rebuilds the whole projection to the head; it takes no --scope or --to-sequence")
    if options.verify and options.to_sequence:
        raise ValueError("--verify compares with the live projection, which is at the head: drop --to-sequence")
    if options.swap and not options.whole:
        raise ValueError("--swap replaces the whole projection: rebuild every partition (drop --partition)")
    if options.to_sequence is not None and len(options.partitions) != 1:
        raise ValueError("--to-sequence is a sequence of one partition: name it (--partition or --scope)")
    suffix = uuid.uuid4().hex[:8]
    table, rel_table = OBJECTS.rebuild_name(suffix), RELATIONSHIP_ROWS.rebuild_name(suffix)
    async with contextlib.AsyncExitStack() as stack:
        conn, reader, side = [await stack.enter_async_context(await psycopg.AsyncConnection.connect(
            database_url, autocommit=True)) for _ in range(3)]  # writes; reads the ledger; computes vectors
        for setting in _BULK_SESSION:
            await conn.execute(setting)
        dropped = await drop_leftovers(conn)
        if dropped and progress:
            progress({"phase": "cleaning", "dropped_leftover_tables": dropped})
        heads = ({options.partitions[0]: options.to_sequence} if options.to_sequence is not None
                 else {p: await ledger_head(conn, p) for p in options.partitions})
        started = time.perf_counter()
        owner = _OWNER_MARK.format(pid=conn.info.backend_pid)
        # A rebuild that is only digested or compared, then dropped, need not be crash-safe: UNLOGGED skips
        # the write-ahead log (half of the write phase). One that replaces the live table is logged.
        kind = sql.SQL("TABLE" if options.swap else "UNLOGGED TABLE")
        async with conn.transaction():  # the tables appear with their owner mark, never without
            for spec, name in ((OBJECTS, table), (RELATIONSHIP_ROWS, rel_table)):
                await conn.execute(sql.SQL("CREATE {} {} (LIKE {} INCLUDING DEFAULTS INCLUDING CONSTRAINTS)").format(
                    kind, sql.Identifier(name), sql.Identifier(spec.live)))
                await comment_table(conn, name, owner)
        # The relationship rebuild gets its primary key at once: its rows are upserted (few, next to objects).
        await conn.execute(sql.SQL("ALTER TABLE {} ADD PRIMARY KEY (scope_id, relationship_id)").format(
            sql.Identifier(rel_table)))
        search_table = f"replay_search_{uuid.uuid4().hex[:8]}"
        # Full-text vectors depend on content only: a third connection computes them while the ledger streams.
        vectors = asyncio.create_task(precompute_search(side, search_table, options.rows(), owner))
        try:
            with _gc_paused():
                events, digest, rel_digest = await _rebuild(
                    conn, reader, (table, rel_table), {p: (0, head) for p, head in heads.items()},
                    options.scope_id, progress, Helper(vectors, search_table))
            report: dict[str, Any] = {"table": table, **_positions(options, "through_sequence", heads),
                                      "events": events, "scope_id": options.scope_id}
            if options.verify or options.swap:
                await add_indexes(conn, table)
                await add_indexes(conn, rel_table, RELATIONSHIP_ROWS, primary_key=False)
                report.update(await _settle(conn, reader, (table, rel_table), options, heads, progress))
            final, rel_final = (PROJECTION, RELATIONSHIPS) if options.swap else (table, rel_table)
            report["table"] = final
            if options.verify or options.swap or digest is None:  # the table may have caught up since
                digest = await projection_digest(conn, final, options.rows())
                rel_digest = await projection_digest(conn, rel_final, options.rows(), RELATIONSHIP_ROWS)
            report["digest"], report["rows"] = digest
            assert rel_digest is not None
            report["relationships"] = {"table": rel_final, "digest": rel_digest[0], "rows": rel_digest[1]}
            if options.keep and not options.swap:
                await _drop_vectors(conn, table)
                await comment_table(conn, table, KEPT_MARK)
                await comment_table(conn, rel_table, KEPT_MARK)
            seconds = time.perf_counter() - started
            report.update(seconds=round(seconds, 3), events_per_second=round(events / seconds) if seconds else 0)
            return report
        finally:
            await stop_task(vectors)  # done unless the rebuild failed first
            await drop_table(conn, search_table)
            if not (options.keep or options.swap):
                await drop_table(conn, table)
                await drop_table(conn, rel_table)


# Scratch tables carry a comment naming the backend that owns them, so a replay that died (SIGKILL, a lost
# connection) leaves nothing behind for long: the next replay drops every rebuild or vector table whose
# owner is gone. Those tables hold lexemes of content and envelope metadata, which must not outlive an
# erasure. A kept rebuild (--keep) is marked as such and left alone.
_OWNER_MARK = "pamledger replay scratch, backend {pid}"
KEPT_MARK = "pamledger replay kept"
_LEFTOVERS = (
    "SELECT c.relname FROM pg_class c WHERE c.relkind = 'r' AND c.relnamespace = current_schema()::regnamespace"
    r" AND (c.relname LIKE 'current\_objects\_rebuild\_%%' OR c.relname LIKE 'replay\_search\_%%'"
    r"      OR c.relname LIKE 'current\_relationships\_rebuild\_%%')"
    " AND coalesce(obj_description(c.oid, 'pg_class'), '') <> %(kept)s"
    " AND NOT EXISTS (SELECT 1 FROM pg_stat_activity a"
    "                 WHERE %(mark)s || a.pid = obj_description(c.oid, 'pg_class'))"
)


async def drop_leftovers(conn: psycopg.AsyncConnection[Any]) -> list[str]:
    """Drop the scratch tables of replays whose connection is gone; returns their names."""
    cur = await conn.execute(_LEFTOVERS, {"kept": KEPT_MARK, "mark": _OWNER_MARK.format(pid="")})
    names = [str(row[0]) for row in await cur.fetchall()]
    for name in names:
        await drop_table(conn, name)
    return names


async def _drop_vectors(conn: psycopg.AsyncConnection[Any], table: str) -> None:
    """A kept rebuild is an audit copy that nothing maintains: its full-text vectors (lexemes of content)
    would outlive a later delete or redaction of that content. So it keeps none; the digest never
    covered them (they derive from the content the digest names)."""
    await conn.execute(sql.SQL("UPDATE {} SET search = NULL WHERE search IS NOT NULL").format(sql.Identifier(table)))


# The writing session's memory for one bulk rebuild: the temp stage holds every row (temp_buffers, settable
# only before the session's first temp table), and the merge hash-joins a million search vectors
# (work_mem); with the defaults (8 MB, 4 MB) both spill to disk.
_BULK_SESSION = ("SET temp_buffers = '1GB'", "SET work_mem = '256MB'")


@dataclass
class Helper:
    """Search vectors being computed on a connection of their own (`vectors`, into `search_table`)."""

    vectors: asyncio.Task[None]
    search_table: str


@contextlib.contextmanager
def _gc_paused() -> Iterator[None]:
    """A first load keeps a key tuple per object (millions of long-lived objects): the cyclic collector
    would rescan them over and over as they pile up, and could not free any of them anyway."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


async def _rebuild(conn: psycopg.AsyncConnection[Any], reader: psycopg.AsyncConnection[Any], tables: tuple[str, str],
                   ranges: dict[int, tuple[int, int]], scope_id: str | None, progress: Progress | None,
                   helper: Helper | None = None) -> tuple[int, tuple[str, int] | None, tuple[str, int] | None]:
    """Fold each partition's events (after, through] (`ranges`) into `tables` (objects, relationships):
    `reader` streams them newest first and each object's row goes into `conn`'s COPY stage the moment its
    latest event is found (rows.newest_projection), so Postgres takes rows while Python reads and only its key
    and 32-byte row hash per object stay in memory; the stage is then merged with the search vectors
    (`helper`'s precomputed ones, else computed in the insert). Relationship rows (far fewer) are kept until
    the COPY ends, then upserted. An object lives in one scope and a scope in one partition, so partitions
    are read one after the other, each along its own index. Returns how many events were read and, for a
    first load (every `after` 0), the digests of both tables' rows."""
    table, rel_table = tables
    lines: dict[tuple[str, str], bytes] = {}  # (scope_id, id) -> row_hash (first load): objects AND relationships seen
    relationships: list[Row] = []
    query = ("SELECT ledger_sequence, scope_id, object_id, event FROM ledger WHERE partition = {partition}"
             " AND ledger_sequence > {after} AND ledger_sequence <= {through}{scope} ORDER BY ledger_sequence DESC")
    scope = sql.SQL(" AND scope_id = {}").format(sql.Literal(scope_id)) if scope_id else sql.SQL("")
    a, b, c, d, e = OBJECT_KEY
    first = all(after == 0 for after, _ in ranges.values())
    total = sum(through - after for after, through in ranges.values())
    count, done, last_report = 0, 0, time.perf_counter()
    async with conn.transaction():
        async with staging(conn) as into:
            for partition, (after, through) in sorted(ranges.items()):
                statement = sql.SQL(query).format(partition=sql.Literal(partition), after=sql.Literal(after),
                                                  through=sql.Literal(through), scope=scope)
                copy_out = sql.SQL("COPY ({}) TO STDOUT (FORMAT BINARY)").format(statement)
                async with reader.cursor().copy(copy_out) as out:
                    out.set_types(["int8", "text", "text", "bytea"])
                    async for sequence, row_scope, object_id, event in out.rows():
                        count += 1
                        found = newest_projection(lines, row_scope, object_id, event, sequence)
                        if found is not None and found.relationship:
                            relationships.append(found.row)
                            lines[(row_scope, object_id)] = b""  # digested below, with the relationships' own columns
                        elif found is not None:  # a catch-up (after > 0) is not digested: it only needs the key
                            row = found.row
                            lines[(row_scope, object_id)] = (row_hash(row[a], row[b], row[c], row[d], row[e])
                                                             if first else b"")
                            await into.write_row(row)
                        if progress and count % 50_000 == 0 and time.perf_counter() - last_report > 1.0:
                            last_report = time.perf_counter()
                            progress({"phase": "reading", "partition": partition, "events": count, "rows": len(lines),
                                      "at_sequence": sequence, "from_sequence": through, "down_to_sequence": after,
                                      "done": done + through - sequence, "total": total})  # newest first
                done += through - after
        for key in ((row[0], row[1]) for row in relationships):
            del lines[key]  # objects only from here on: `lines` is the object digest's input
        if progress:
            progress({"phase": "merging", "events": count, "rows": len(lines), "relationships": len(relationships)})
        for start in range(0, len(relationships), _RELATIONSHIP_CHUNK):
            await upsert_relationships(conn, relationships[start:start + _RELATIONSHIP_CHUNK], rel_table)
        rel_digest = relationship_digest(relationships) if first else None
        search_table = None
        if helper is not None:
            await helper.vectors
            search_table = helper.search_table
        # The digest of a first load is that of these rows: sorted and hashed while Postgres merges them.
        digesting = asyncio.create_task(asyncio.to_thread(combined_digest, lines)) if first else None
        try:
            await merge(conn, table, upsert=not first, search_table=search_table)
        finally:
            digest = await digesting if digesting is not None else None
    return count, digest, rel_digest


async def _settle(conn: psycopg.AsyncConnection[Any], reader: psycopg.AsyncConnection[Any], tables: tuple[str, str],
                  options: ReplayOptions, heads: dict[int, int], progress: Progress | None) -> dict[str, Any]:
    """Under the checkpoint locks of the rebuilt partitions: catch up to each live checkpoint, compare, and
    swap if asked (both tables: the projector writes them in one transaction with its partition's one
    checkpoint). Each partition's projector waits meanwhile; the others go on."""
    table, rel_table = tables
    async with conn.transaction():
        live, resets, catch_up = {}, {}, {}
        for partition in sorted(heads):  # one order for every replay: two never wait on each other
            name = partition_checkpoint(PROJECTION, partition)
            # The row is made (at 0) if the projector has none yet, so its first batch waits for the swap too.
            await advance_checkpoint(conn, name, 0, partition)
            cur = await conn.execute("SELECT ledger_sequence, ledger_id FROM projection_checkpoints"
                                     " WHERE projection = %s FOR UPDATE", (name,))
            row = await cur.fetchone()
            assert row is not None
            live[partition], found = int(row[0]), row[1]
            ledger_id = await ledger_identity(conn, partition)
            # A checkpoint of another ledger, or ahead of this one, has nothing to catch up with: a swap
            # replaces it by the rebuild's own (the live projector refuses to follow it until then).
            if found not in (None, ledger_id) or live[partition] > await ledger_head(conn, partition):
                resets[partition] = {"from": live[partition], "from_ledger_id": found, "to": heads[partition],
                                     "ledger_id": ledger_id}
            elif live[partition] > heads[partition]:
                catch_up[partition] = (heads[partition], live[partition])
        if catch_up:
            await _rebuild(conn, reader, tables, catch_up, options.scope_id, progress)
        outcome: dict[str, Any] = _positions(options, "live_checkpoint", live)
        if options.verify:
            verdict = await compare(conn, table, options.rows())
            related = await compare(conn, rel_table, options.rows(), RELATIONSHIP_ROWS)
            outcome["verify"] = {**verdict, "equal": verdict["equal"] and related["equal"], "relationships": related}
        if options.swap:
            await swap_in(conn, table)
            await swap_in(conn, rel_table, RELATIONSHIP_ROWS)
            outcome["swapped"] = True
            for partition, reset in resets.items():
                await conn.execute("UPDATE projection_checkpoints SET ledger_sequence = %s, ledger_id = %s"
                                   " WHERE projection = %s",
                                   (reset["to"], reset["ledger_id"], partition_checkpoint(PROJECTION, partition)))
            if resets:
                outcome.update(_positions(options, "checkpoint_reset", resets))
        return outcome


def _positions(options: ReplayOptions, key: str, by_partition: dict[int, Any]) -> dict[str, Any]:
    """A report's per-partition value: as it always was for a one-partition ledger (`key`: the value), keyed
    by partition ("0", "1", ...) for a ledger of several, whichever partitions were rebuilt."""
    if options.ledger_partitions == 1:
        return {key: by_partition[0]} if 0 in by_partition else {}
    return {key: {str(p): value for p, value in sorted(by_partition.items())}}
