"""Projection's replay step: `projector.replay.replay` against the raw rate of reading and decoding the ledger.

The baseline is the floor any rebuild has to pay: `COPY (SELECT ledger_sequence, event FROM ledger ORDER
BY ledger_sequence) TO STDOUT (FORMAT BINARY)` through the same async psycopg API replay uses, decoding
every event with msgspec. It runs before and after replay (the faster of the two counts), so the ratio
replay/raw is not flattered by a cold cache. Replay's phases (read+fold+stage, then merge+digest) are timed
from its progress callback.
"""

from __future__ import annotations

import time
from typing import Any

import msgspec
import psycopg

from psycopg import sql

from projector.replay import ReplayOptions, projection_digest, replay

_decoder = msgspec.json.Decoder(dict[str, Any])
RAW_STATEMENT = "COPY (SELECT ledger_sequence, event FROM ledger ORDER BY ledger_sequence) TO STDOUT (FORMAT BINARY)"


async def raw_read(database_url: str) -> dict[str, Any]:
    """Read every (ledger_sequence, event) with binary COPY and decode each event: events/s."""
    count, last = 0, 0
    started = time.perf_counter()
    async with await psycopg.AsyncConnection.connect(database_url, autocommit=True) as conn:
        cur = conn.cursor()
        async with cur.copy(RAW_STATEMENT) as copy:
            copy.set_types(["int8", "bytea"])
            async for sequence, event in copy.rows():
                _decoder.decode(event)
                count, last = count + 1, sequence
    seconds = time.perf_counter() - started
    if count != last:
        raise RuntimeError(f"raw read saw {count} events but the last sequence was {last}")
    return {"events": count, "seconds": round(seconds, 3), "events_per_second": round(count / seconds)}


async def timed_replay(database_url: str, options: ReplayOptions) -> dict[str, Any]:
    """Run replay and split its time where it stops streaming the ledger into the stage and starts merging
    (reported by its progress callback)."""
    marks: dict[str, float] = {}

    def progress(note: dict[str, Any]) -> None:
        if note.get("phase") == "merging" and "merging" not in marks:
            marks["merging"] = time.perf_counter()

    started = time.perf_counter()
    report = await replay(database_url, options, progress)
    seconds = time.perf_counter() - started
    streaming = marks.get("merging", started) - started
    return {"events": report["events"], "rows": report["rows"], "seconds": round(seconds, 3),
            "events_per_second": round(report["events"] / seconds) if seconds else 0,
            "replay_reported_events_per_second": report["events_per_second"],
            "stream_seconds": round(streaming, 3), "merge_digest_seconds": round(seconds - streaming, 3),
            "stream_events_per_second": round(report["events"] / streaming) if streaming > 0 else None,
            "digest": report["digest"], "swapped": bool(report.get("swapped")), "table": report["table"]}


async def replay_benchmark(database_url: str, log: Any) -> dict[str, Any]:
    """raw, replay (fresh table), raw again; the ratio uses the faster raw pass.

    The rebuilt table is kept (ReplayOptions(keep=True) only skips replay's final DROP) so that its digest
    step can be timed once more on its own, then dropped.
    """
    log("replay: raw COPY+decode pass 1")
    raw1 = await raw_read(database_url)
    log(f"replay: raw {raw1['events_per_second']} events/s; running replay(ReplayOptions()) ...")
    rep = await timed_replay(database_url, ReplayOptions(keep=True))  # keep: only so the digest can be re-timed
    async with await psycopg.AsyncConnection.connect(database_url, autocommit=True) as conn:
        t0 = time.perf_counter()
        await projection_digest(conn, rep["table"], None)
        rep["digest_seconds"] = round(time.perf_counter() - t0, 3)
        await conn.execute(sql.SQL("DROP TABLE {}").format(sql.Identifier(rep["table"])))
    log(f"replay: {rep['events_per_second']} events/s; raw pass 2")
    raw2 = await raw_read(database_url)
    raw = max(raw1["events_per_second"], raw2["events_per_second"])
    return {"raw_passes": [raw1, raw2], "raw_events_per_second": raw, "replay": rep,
            "ratio": rep["events_per_second"] / raw if raw else 0.0}


async def build_projection(database_url: str, log: Any) -> dict[str, Any]:
    """replay --swap fills current_objects; set the checkpoint to the ledger head; VACUUM ANALYZE."""
    log("projection: replay(ReplayOptions(swap=True)) ...")
    rep = await timed_replay(database_url, ReplayOptions(swap=True))
    async with await psycopg.AsyncConnection.connect(database_url, autocommit=True) as conn:
        row = await (await conn.execute("SELECT coalesce(max(ledger_sequence), 0) FROM ledger")).fetchone()
        head = int(row[0]) if row else 0
        cur = await conn.execute("SELECT ledger_sequence FROM projection_checkpoints WHERE projection = 'current_objects'")
        before = await cur.fetchone()
        await conn.execute(
            "INSERT INTO projection_checkpoints (projection, ledger_sequence) VALUES ('current_objects', %s)"
            " ON CONFLICT (projection) DO UPDATE SET ledger_sequence = excluded.ledger_sequence", (head,))
        t0 = time.perf_counter()
        await conn.execute("VACUUM ANALYZE current_objects")
        await conn.execute("VACUUM ANALYZE content_store")
        vacuum = time.perf_counter() - t0
        size = await (await conn.execute("SELECT pg_total_relation_size('current_objects')")).fetchone()
    rep.update(head=head, checkpoint_set_by_replay=before is not None and int(before[0]) == head,
               vacuum_analyze_seconds=round(vacuum, 2), table_mib=round(int(size[0]) / 2**20) if size else None)
    return rep
