"""In-process baselines without NATS: (d) the `eventsourcing` library on Postgres, and the durable-commit floor.

(d) One `eventsourcing` Application with its Postgres persistence module, configured through the
POSTGRES_* environment keys, in its own database on the same server; 16 threads each create one
aggregate and save it (one transaction, one durable commit per save) as fast as they can.

The commit floor is a single-row INSERT on an autocommit psycopg connection: one round trip that
includes one durable commit (synchronous_commit=on, fsync=on), one at a time.
"""

from __future__ import annotations

import threading
import time
import uuid
from typing import Any

import psycopg
from eventsourcing.application import Application
from eventsourcing.domain import Aggregate

from bench.load import Result


class Claim(Aggregate):
    """The same fact a pamledger create records: a small claim."""

    def __init__(self, text: str, confidence: float):
        self.text = text
        self.confidence = confidence


class ClaimsApp(Application[uuid.UUID]):
    pass


def eventsourcing_env(pg: dict[str, Any], threads: int) -> dict[str, str]:
    return {
        "PERSISTENCE_MODULE": "eventsourcing.postgres",
        "POSTGRES_DBNAME": pg["dbname"], "POSTGRES_HOST": pg["host"], "POSTGRES_PORT": pg["port"],
        "POSTGRES_USER": pg["user"], "POSTGRES_PASSWORD": pg["password"] or "",
        "POSTGRES_POOL_SIZE": str(threads), "POSTGRES_MAX_OVERFLOW": "0",
    }


def run_eventsourcing(pg: dict[str, Any], threads: int, warmup: float, duration: float) -> Result:
    """`threads` threads creating and saving one aggregate each per iteration, for warmup+duration."""
    app = ClaimsApp(env=eventsourcing_env(pg, threads))
    try:
        return _threaded(lambda: app.save(Claim("the benchmark sky is blue", 0.5)), "eventsourcing",
                         threads, warmup, duration)
    finally:
        app.close()


def run_commit_floor(url: str, warmup: float, duration: float) -> Result:
    """Serial single-row INSERTs, each its own durable transaction (autocommit)."""
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("CREATE TABLE IF NOT EXISTS commit_probe (id bigint PRIMARY KEY, note text NOT NULL)")
        counter = iter(range(1, 1 << 62))
        return _threaded(
            lambda: conn.execute("INSERT INTO commit_probe (id, note) VALUES (%s, %s)", (next(counter), "x")),
            "durable commit", 1, warmup, duration)


def _threaded(op: Any, name: str, threads: int, warmup: float, duration: float) -> Result:
    """Run op in a loop on `threads` threads; keep round trips that complete inside the measured window."""
    start = time.perf_counter() + warmup
    end = start + duration
    samples: list[list[float]] = [[] for _ in range(threads)]
    errors: list[BaseException] = []

    def loop(out: list[float]) -> None:
        try:
            while time.perf_counter() < end and not errors:
                t0 = time.perf_counter()
                op()
                t1 = time.perf_counter()
                if start <= t1 <= end:
                    out.append(t1 - t0)
        except BaseException as exc:  # noqa: BLE001 - re-raised in the caller's thread
            errors.append(exc)

    workers = [threading.Thread(target=loop, args=(s,), daemon=True) for s in samples]
    try:
        for worker in workers:
            worker.start()
        for worker in workers:
            worker.join(warmup + duration + 60)
    except BaseException as exc:  # Ctrl-C: make the workers stop at their next iteration
        errors.append(exc)
        raise
    if errors:
        raise errors[0]
    latencies = [x for s in samples for x in s]
    return Result(name, len(latencies), duration, latencies, threads)
