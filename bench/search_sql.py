"""The SQL of scoped vector search, as small functions the search service can share (one space's table).

Why each path exists:
- exact (small scopes): a MATERIALIZED CTE holds the scope's rows (found through the table's primary key,
  which starts with scope_id), then every distance is computed and sorted. The HNSW index cannot be used,
  so the answer is exact; cost grows with the scope, not the table.
- HNSW (large scopes): pgvector's iterative index scan (`hnsw.iterative_scan = relaxed_order`) keeps
  walking the graph until the scope filter has let `candidates` rows through (or `hnsw.max_scan_tuples`
  is reached); the candidates are MATERIALIZED and re-sorted by their exact distance, because
  relaxed_order may return them slightly out of order. `enable_sort = off` makes the HNSW scan the only
  plan without an extra sort, so a generic (prepared) plan cannot fall back to sorting a whole scope.
- ground truth: the plain ORDER BY with index scans disabled (the HNSW index is never used; the primary
  key is used only through a bitmap scan, which HNSW does not support).
Ties are broken by object_id everywhere, so two exact answers are identical.

Every statement takes the named parameters `scope` (scope_id), `q` (pgvector text literal) and `k`;
HNSW also `candidates`. Settings are transaction-local (`set_config(..., true)`), sent in the same
transaction as the query: a pooled connection never carries one request's settings into the next.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import psycopg
from psycopg import sql


@dataclass(frozen=True)
class HnswSetting:
    """One HNSW operating point: the candidate list size, rows re-ranked, and the iterative-scan cap."""

    ef_search: int
    candidates: int
    max_scan_tuples: int = 20_000  # pgvector's default

    @property
    def label(self) -> str:
        return f"ef{self.ef_search}/c{self.candidates}/max{self.max_scan_tuples}"

    def settings(self) -> dict[str, str]:
        return {"hnsw.ef_search": str(self.ef_search), "hnsw.iterative_scan": "relaxed_order",
                "hnsw.max_scan_tuples": str(self.max_scan_tuples), "enable_sort": "off"}


EXACT_SETTINGS: dict[str, str] = {}
GROUND_TRUTH_SETTINGS = {"enable_indexscan": "off"}


def exact_query(table: sql.Identifier) -> sql.Composed:
    """Exact top-k inside one scope: the scope's rows first, then every distance."""
    return sql.SQL(
        "WITH scope_rows AS MATERIALIZED ("
        " SELECT object_id, version_id, embedding FROM {t} WHERE scope_id = %(scope)s)"
        " SELECT object_id, version_id, embedding <=> %(q)s::vector AS distance FROM scope_rows"
        " ORDER BY distance, object_id LIMIT %(k)s").format(t=table)


def hnsw_query(table: sql.Identifier) -> sql.Composed:
    """Approximate top-k inside one scope: HNSW iterative scan for `candidates` rows, exact re-rank."""
    return sql.SQL(
        "WITH candidates AS MATERIALIZED ("
        " SELECT object_id, version_id, embedding <=> %(q)s::vector AS distance FROM {t}"
        " WHERE scope_id = %(scope)s ORDER BY embedding <=> %(q)s::vector LIMIT %(candidates)s)"
        " SELECT object_id, version_id, distance FROM candidates ORDER BY distance, object_id LIMIT %(k)s"
    ).format(t=table)


def ground_truth_query(table: sql.Identifier) -> sql.Composed:
    """The plain statement; exact only under GROUND_TRUTH_SETTINGS (no index scan at all)."""
    return sql.SQL(
        "SELECT object_id, version_id, embedding <=> %(q)s::vector AS distance FROM {t}"
        " WHERE scope_id = %(scope)s ORDER BY embedding <=> %(q)s::vector, object_id LIMIT %(k)s").format(t=table)


def settings_statement(settings: dict[str, str]) -> tuple[sql.Composed, list[str]] | None:
    """One `SELECT set_config(name, value, true), ...` for the whole dict (one round trip), or None."""
    if not settings:
        return None
    calls = sql.SQL(", ").join(sql.SQL("set_config(%s, %s, true)") for _ in settings)
    params = [x for pair in settings.items() for x in pair]
    return sql.SQL("SELECT ") + calls, params


def search(conn: psycopg.Connection[Any], statement: sql.Composed, settings: dict[str, str],
           params: dict[str, Any]) -> list[tuple[str, str, float]]:
    """Run one search in its own transaction with its settings: [(object_id, version_id, distance)]."""
    prelude = settings_statement(settings)
    with conn.transaction():
        if prelude is not None:
            conn.execute(*prelude)
        return conn.execute(statement, params).fetchall()


def timed_searches(conn: psycopg.Connection[Any], statement: sql.Composed, settings: dict[str, str],
                   jobs: list[tuple[str, str]], truth: list[list[str]], k: int, extra: dict[str, Any],
                   warmup: int) -> tuple[list[float], list[float]]:
    """Run `warmup` searches untimed, then each job alone: (milliseconds per search, recall@k against
    `truth`). Both search benches time their SQL this one way."""
    for scope, q in jobs[:warmup]:
        search(conn, statement, settings, {"scope": scope, "q": q, "k": k, **extra})
    times, recalls = [], []
    for (scope, q), expected in zip(jobs, truth):
        t0 = time.perf_counter()
        got = search(conn, statement, settings, {"scope": scope, "q": q, "k": k, **extra})
        times.append((time.perf_counter() - t0) * 1000)
        recalls.append(len({r[0] for r in got} & set(expected)) / len(expected))
    return times, recalls


def plan_uses(conn: psycopg.Connection[Any], statement: sql.Composed, settings: dict[str, str],
              params: dict[str, Any], index_name: str) -> bool:
    """Whether EXPLAIN of the statement under these settings names this index (checks the path is real)."""
    prelude = settings_statement(settings)
    with conn.transaction():
        if prelude is not None:
            conn.execute(*prelude)
        rows = conn.execute(sql.SQL("EXPLAIN ") + statement, params).fetchall()
    return any(index_name in row[0] for row in rows)
