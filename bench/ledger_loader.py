"""Synthetic ledger loader: N valid, hash-chained ledger events COPYed in bulk into a fresh migrated database.

Every event is made by the writer's pure core: commands are msgspec Structs (`schemas.commands`),
decided by `command_handler.core.decide` against the object's head, and laid out exactly as
`command_handler.core.planner._add_rows` lays them out (ledger row with the canonical event bytes,
memory_versions row with the canonical metadata, content_store row; scopes rows come from
`plan_batch` itself). The hash chain is `command_handler.core.chain.row_hash`. Chunk 0 is also run through
`plan_batch` and must give the same rows, so the loader cannot drift from the writer unnoticed.

Only the Stamp differs from the live writer: ids are fresh uuids like the writer's, but `committed_at`
follows a synthetic clock spread over `span_days` up to now, so time windows select something.

Mix: `object_created` for new objects (types, validation and lifecycle states varied; content a few
English sentences, bench.ledger_content), and for a share of objects a later `object_updated` and/or a
`validation_transitioned` (a move the section 9.5 table allows), due 1..`follow_up_window` events
later. Chunks of exactly `chunk` events are self-contained (follow-ups stay in their chunk), so worker
processes decide chunks in parallel; this process chains the hashes in ledger order and COPYs (binary).
The database is migrated inside the loading transaction (bench.ledger_schema), so the tables take
`COPY ... FREEZE`; keys and indexes are dropped for the load and rebuilt from their catalogued
definitions afterwards (as pg_restore does). Both are part of the measured time.
"""

from __future__ import annotations

import concurrent.futures as cf
import itertools
import multiprocessing
import time
from collections import Counter
from collections.abc import Callable
from typing import Any

import msgspec
import psycopg
from psycopg import sql

from bench import pgcopy
from bench.ledger_commands import Key, LoadSpec, chunk_commands, scope_ids
from bench.ledger_schema import BulkIndexes, migrate_in_transaction
from command_handler.core.chain import GENESIS_HASH, row_hash
from command_handler.core.decide import decide
from command_handler.core.intake import Parsed
from command_handler.core.planner import PlanInputs, plan_batch
from command_handler.core.state import ObjectHead, Stamp
from schemas.canonical import canonical_bytes
from schemas.commands import CreateObject, CreateScope, ObjectCommand
from schemas.registry import TypeRegistry, default_registry

__all__ = ["LoadSpec", "build_chunk", "load_ledger", "scope_ids"]
Progress = Callable[[dict[str, Any]], None]
LEDGER_COPY = ("COPY ledger (partition, ledger_sequence, event_id, operation_id, scope_id, object_id, version_id,"
               " event_type, recorded_at, event, prev_hash, row_hash) FROM STDIN (FORMAT BINARY, FREEZE)")
VERSIONS_COPY = ("COPY memory_versions (scope_id, object_id, sequence, version_id, ledger_sequence, meta,"
                 " content_digest) FROM STDIN (FORMAT BINARY, FREEZE)")
CONTENT_COPY = "COPY content_store (content_digest, scope_id, object_id, salt, content) FROM STDIN (FORMAT BINARY, FREEZE)"


class Chunk(msgspec.Struct, kw_only=True):
    """One chunk as binary COPY bytes (few large objects: cheap to pass between processes).

    `ledger` concatenates each row's tuple bytes without prev_hash/row_hash, which only the chain knows;
    row i ends at `ledger_ends[i]` with its canonical event bytes (`event_lengths[i]` long).
    """

    first_sequence: int
    ledger: bytes
    ledger_ends: list[int]
    event_lengths: list[int]
    versions: bytes
    content: bytes
    objects: int
    by_type: dict[str, int]


def build_chunk(spec: LoadSpec, index: int, check: bool = False) -> Chunk:
    """Decide chunk `index` with the writer's core; with `check`, prove the rows equal plan_batch's."""
    ledger: list[tuple[Any, ...]] = []
    versions: list[tuple[Any, ...]] = []
    content: list[tuple[Any, ...]] = []
    heads: dict[Key, ObjectHead] = {}
    seq, objects = index * spec.chunk, 0
    registry = default_registry()
    pairs: list[tuple[ObjectCommand, Stamp]] = []
    for command, stamp, keep in chunk_commands(spec, index):
        seq += 1
        key = (command.scope_id, stamp.object_id)
        decision = decide(heads.pop(key, None), command, stamp, registry)
        event, head = decision.event, decision.head
        assert head is not None  # object commands always commit a version
        if keep:
            heads[key] = head
        objects += isinstance(command, CreateObject)
        # The row layout of command_handler.core.planner._add_rows (hashes are chained by the caller).
        ledger.append((0, seq, event.event_id, event.operation_id, event.scope_id, event.object_id,
                       event.version_id, event.event_type, event.recorded_at, canonical_bytes(event)))
        versions.append((head.scope_id, head.object_id, head.sequence, head.version_id, seq,
                         canonical_bytes(head.meta), head.content_digest))
        if decision.content is not None and head.content_digest is not None:
            content.append((head.content_digest, head.scope_id, head.object_id, stamp.salt, decision.content))
        if check:
            pairs.append((command, stamp))
    if check:
        _check_against_planner((ledger, versions, content), pairs, index * spec.chunk, registry)
    prefixes = [pgcopy.ledger_prefix(row) for row in ledger]
    return Chunk(first_sequence=index * spec.chunk + 1, ledger=b"".join(prefixes),
                 ledger_ends=list(itertools.accumulate(len(p) for p in prefixes)),
                 event_lengths=[len(row[9]) for row in ledger],
                 versions=pgcopy.table_bytes([pgcopy.version_tuple(v) for v in versions]),
                 content=pgcopy.table_bytes([pgcopy.content_tuple(c) for c in content]), objects=objects,
                 by_type=dict(Counter(row[7] for row in ledger)))


def _check_against_planner(rows: tuple[list[tuple[Any, ...]], ...], pairs: list[tuple[ObjectCommand, Stamp]],
                           after: int, registry: TypeRegistry) -> None:
    stamps = iter([s for _, s in pairs])
    items: list[Parsed | Any] = [Parsed(name=type(c).__name__, command=c, operation_id=None, idempotency_key=None,
                                        request_digest="") for c, _ in pairs]
    plan = plan_batch(items, PlanInputs(heads={}, idempotency={}, scope_known=lambda s: True,
                                        stamp=lambda _p: next(stamps), tail=(after, GENESIS_HASH),
                                        registry=registry))
    b = plan.batch
    mine = ([r[1:] for r in rows[0]], rows[1], rows[2])
    theirs = ([(r.ledger_sequence, r.event_id, r.operation_id, r.scope_id, r.object_id, r.version_id, r.event_type,
                r.recorded_at, r.event) for r in b.ledger],
              [(v.scope_id, v.object_id, v.sequence, v.version_id, v.ledger_sequence, v.meta, v.content_digest)
               for v in b.versions],
              [(c.content_digest, c.scope_id, c.object_id, c.salt, c.content) for c in b.content])
    if any(o.error is not None for o in plan.outcomes) or mine != theirs:
        raise AssertionError("the loader's rows differ from command_handler.core.planner.plan_batch's for the same commands")


def _scope_rows(spec: LoadSpec) -> list[tuple[str, str, str | None, str | None]]:
    items: list[Parsed | Any] = [Parsed(name="create_scope", command=CreateScope(scope_id=s, scope_kind="workspace"),
                                        operation_id=None, idempotency_key=None, request_digest="")
                                 for s in scope_ids(spec.scopes)]
    plan = plan_batch(items, PlanInputs(heads={}, idempotency={}, scope_known=lambda s: False,
                                        stamp=_no_stamp, tail=(0, GENESIS_HASH), registry=default_registry()))
    return plan.batch.scopes


def _no_stamp(_parsed: Parsed) -> Stamp:
    raise AssertionError("scope creation takes no stamp")


def load_ledger(database_url: str, spec: LoadSpec, progress: Progress | None = None) -> dict[str, Any]:
    """Migrate an empty database and load the ledger described by `spec`, in ONE transaction.

    Tables created in the loading transaction take COPY FREEZE (no hint-bit rewrite of every page on
    the first scan later). Returns counts and rates.
    """
    if not spec.t_end:  # one clock for every worker process
        spec = msgspec.structs.replace(spec, t_end=time.time())
    chunks = (spec.events + spec.chunk - 1) // spec.chunk
    counts: Counter[str] = Counter()
    objects, prev, wait_s = 0, GENESIS_HASH, 0.0
    started = time.perf_counter()
    with psycopg.connect(database_url, autocommit=True) as conn:
        if conn.execute("SELECT to_regclass('ledger') IS NULL").fetchone() != (True,):
            raise RuntimeError("the ledger loader needs an empty, unmigrated database")
        with conn.transaction():
            migrate_in_transaction(conn)
            conn.cursor().executemany("INSERT INTO scopes (scope_id, scope_kind, parent_scope_id, policy)"
                                      " VALUES (%s, %s, %s, %s)", _scope_rows(spec))
            indexes = BulkIndexes(conn, ("ledger", "memory_versions", "content_store"))
            indexes.drop()
            ctx = multiprocessing.get_context("spawn")
            with cf.ProcessPoolExecutor(max_workers=spec.workers, mp_context=ctx) as pool:
                pending: list[cf.Future[Chunk]] = []
                try:
                    pending += [pool.submit(build_chunk, spec, i, i == 0)
                                for i in range(min(chunks, 2 * spec.workers + 1))]
                    for index in range(chunks):
                        t0 = time.perf_counter()
                        chunk = pending.pop(0).result()
                        wait_s += time.perf_counter() - t0
                        if index + len(pending) + 1 < chunks:
                            pending.append(pool.submit(build_chunk, spec, index + len(pending) + 1))
                        prev = _write_chunk(conn, chunk, prev)
                        objects += chunk.objects
                        counts.update(chunk.by_type)
                        if progress:
                            progress({"phase": "loading", "events": chunk.first_sequence + len(chunk.ledger_ends) - 1,
                                      "of": spec.events})
                finally:
                    for future in pending:
                        future.cancel()
            t_index = time.perf_counter()
            indexes.restore()
            index_s = time.perf_counter() - t_index
        for table in ("scopes", "ledger", "memory_versions", "content_store"):
            conn.execute(sql.SQL("ANALYZE {}").format(sql.Identifier(table)))
    seconds = time.perf_counter() - started
    return {"events": spec.events, "objects": objects, "scopes": spec.scopes, "by_type": dict(counts),
            "seconds": round(seconds, 2), "events_per_second": round(spec.events / seconds),
            "index_rebuild_seconds": round(index_s, 2), "waited_for_workers_seconds": round(wait_s, 2),
            "workers": spec.workers, "head_sequence": spec.events, "head_hash": prev.hex(),
            "clock_start": spec.t_end - spec.span_days * 86_400, "clock_end": spec.t_end}


def _write_chunk(conn: psycopg.Connection[Any], chunk: Chunk, prev: bytes) -> bytes:
    """Chain the hashes and COPY the chunk's rows (the writer's layout); returns the tail hash."""
    blob = memoryview(chunk.ledger)
    out: list[bytes | memoryview] = [pgcopy.HEADER]
    start, seq = 0, chunk.first_sequence
    for end, length in zip(chunk.ledger_ends, chunk.event_lengths):
        new = row_hash(prev, seq, blob[end - length:end])  # type: ignore[arg-type]
        out += (blob[start:end], pgcopy.bytea(prev), pgcopy.bytea(new))
        prev, start, seq = new, end, seq + 1
    out.append(pgcopy.TRAILER)
    cur = conn.cursor()
    for statement, data in ((LEDGER_COPY, b"".join(out)), (VERSIONS_COPY, chunk.versions),
                            (CONTENT_COPY, chunk.content)):
        with cur.copy(statement) as copy:
            copy.write(data)
    return prev
