"""Why the projector lags: the plan of its live batch statement, captured from the real code path.

`projector.store.upsert_rows` (the statement `apply_rows` sends for every live batch) runs inside a
transaction that is rolled back, on a connection with `auto_explain` loaded and `client_min_messages =
log`, so its plan comes back as a notice (no copy of the projector's SQL lives here). The rows are the
projection rows of the last ledger events, as the live projector would fold them; the same rows under new
object ids are then upserted for real (inserts with all index maintenance) and rolled back, to time the
live projector's case.
"""

from __future__ import annotations

import statistics
import time
from typing import Any

import psycopg

from projector.rows import Row, current_row, fold
from projector.store import upsert_rows



async def explain_projector_batch(database_url: str, events: int = 500) -> dict[str, Any]:
    """EXPLAIN ANALYZE (via auto_explain) of one projector batch of `events` events; nothing is changed."""
    notices: list[str] = []
    async with await psycopg.AsyncConnection.connect(database_url, autocommit=True) as conn:
        conn.add_notice_handler(lambda d: notices.append(d.message_primary or ""))
        for setting in ("LOAD 'auto_explain'", "SET auto_explain.log_min_duration = 0",
                        "SET auto_explain.log_analyze = on", "SET auto_explain.log_buffers = on",
                        "SET auto_explain.log_timing = on"):
            await conn.execute(setting)
        cur = await conn.execute("SELECT ledger_sequence, event FROM ledger ORDER BY ledger_sequence DESC LIMIT %s",
                                 (events,))
        rows: dict[tuple[str, str], Row] = {}
        for sequence, event in reversed(await cur.fetchall()):
            fold(rows, current_row(bytes(event), sequence))
        count = (await (await conn.execute("SELECT count(*) FROM content_store")).fetchone() or (0,))[0]
        t0 = time.perf_counter()
        try:
            async with conn.transaction():
                await conn.execute("SET LOCAL client_min_messages = log")
                await upsert_rows(conn, list(rows.values()))
                raise psycopg.Rollback()
        finally:
            seconds = time.perf_counter() - t0
        fresh = [(r[0], r[1] + ":m2-explain", *r[2:]) for r in rows.values()]  # same rows, new objects
        await conn.execute("SET auto_explain.log_min_duration = -1")  # no instrumentation for the timing
        t1 = time.perf_counter()
        async with conn.transaction():
            await upsert_rows(conn, fresh)
            inserted = time.perf_counter() - t1
            raise psycopg.Rollback()
    plan = next((n for n in notices if "Insert on current_objects" in n), "")
    lines = [line for line in plan.splitlines() if line.strip()]
    return {"rows": len(rows), "content_store_rows": int(count), "batch_seconds": round(seconds, 3),
            "insert_seconds": round(inserted, 3),
            "seq_scan_content_store": "Seq Scan on content_store" in plan, "plan": lines}


def commit_stats(times: list[float], points: list[int], first: int, last: int) -> dict[str, Any]:
    """Projector commits (NOTIFYs) covering ledger sequences first..last: how many, how big, how far apart."""
    chosen = [(t, p) for t, p in zip(times, points) if first <= p <= last + 10_000_000]
    chosen = [c for i, c in enumerate(chosen) if i == 0 or c[1] > chosen[i - 1][1]]
    sizes = [b[1] - a[1] for a, b in zip(chosen, chosen[1:])]
    gaps = [(b[0] - a[0]) * 1e3 for a, b in zip(chosen, chosen[1:])]
    return {"commits": len(chosen), "events_per_commit_p50": statistics.median(sizes) if sizes else None,
            "events_per_commit_max": max(sizes) if sizes else None,
            "interval_ms_p50": round(statistics.median(gaps), 1) if gaps else None,
            "interval_ms_max": round(max(gaps), 1) if gaps else None}
