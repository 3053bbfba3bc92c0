"""Semantic search: nearest vectors of ONE space within ONE scope, structured filters applied in SQL.

Why this shape:
- A statement names exactly one space's table (embedding.store), so no search can compare vectors of
  two spaces; the query vector is checked against the space's dimensions, and text is embedded only by an
  embedder of exactly that space (embedding.known.embedder_for), else embedding_space_mismatch.
- The scope and the structured filters are joined in SQL (current_objects) before anything is returned,
  so a row the caller may not see never leaves Postgres and never takes a place in the top k.
- Small scopes are searched exactly: a MATERIALIZED CTE holds the scope's rows, so the planner cannot use the
  HNSW index (which would search all scopes' vectors and filter afterwards). A scope with more than
  `search_exact_threshold` vectors goes through HNSW with iterative scans (pgvector >= 0.8: the scan goes on
  until enough rows pass the scope and filters, `relaxed_order`, bounded by `hnsw.max_scan_tuples`), and
  the candidates are re-ranked exactly by an outer ORDER BY, so a small scope inside a large table still
  gets its true neighbours and the order is total: distance, object_id, version_id. A mid-size scope (up to
  `search_mid_threshold` vectors) searches with the longer `search_mid_ef_search` list: recall falls with
  the scope's share of the table, not its size, and ef_search is what brings it back.
"""

from __future__ import annotations

import asyncio
import math
from dataclasses import dataclass
from typing import Any

import psycopg
from psycopg import sql

from embedding.known import embedder_for
from embedding.store import SpaceRow, find_space, vector_literal
from embedding.text_profile import clean
from infra.settings import QuerySettings
from query.plan import filter_clauses
from schemas.errors import InvalidRequest
from schemas.search import EmbeddingSpaceMismatch, SearchRequest

# Columns every candidate row carries, in this order.
# `stale`: the vector was made from an older version than the projected one (the indexer has not caught up).
# By sequence, not by id: when the projector lags the indexer, the vector may be the NEWER of the two.
# Ranked without content: content is read for the rows returned only (the outer query), not for every
# row of the scope or every HNSW candidate.
_COLUMNS = ("p.meta, p.content_digest, p.object_id, p.version_id, p.ledger_sequence, v.version_id AS vector_version_id,"
            " v.embedding <=> %s::vector AS distance, v.version_sequence < p.sequence AS stale")
_WITH_CONTENT = ("SELECT r.meta, c.content, r.object_id, r.version_id, r.ledger_sequence, r.vector_version_id,"
                 " r.distance, r.stale FROM ({ranked}) r LEFT JOIN content_store c ON c.content_digest = r.content_digest"
                 " ORDER BY r.distance, r.object_id, r.version_id")


@dataclass(frozen=True)
class Probe:
    """What a search looks for in which space: None space = no default space registered yet."""

    space: SpaceRow | None
    vector: list[float] | None
    truncated: bool  # the model's window cut the query text


@dataclass(frozen=True)
class Plan:
    """How the candidates were found (the reply's `index` block)."""

    method: str  # "exact" | "hnsw"
    ef_search: int | None


async def probe(conn: psycopg.AsyncConnection[Any], request: SearchRequest) -> Probe:
    """Resolve the space and the query vector; every registry-dependent refusal happens here."""
    space = await find_space(conn, request.embedding_space_id)
    if space is None:
        if request.embedding_space_id is not None:
            raise InvalidRequest("unknown embedding space",
                                 details={"embedding_space_id": request.embedding_space_id})
        if request.vector is not None:  # text still searches by words; a bare vector belongs to no space
            raise EmbeddingSpaceMismatch("a vector needs an Embedding Space, and none is registered yet",
                                         details={"embedding_space_id": None, "vector_length": len(request.vector)})
        return Probe(None, None, False)
    return await probe_in(space, request)


async def probe_in(space: SpaceRow, request: SearchRequest) -> Probe:
    """The query vector in this very space (a search at a snapshot resolves its space itself)."""
    if request.vector is not None:
        if len(request.vector) != space.dimensions:
            raise EmbeddingSpaceMismatch(
                "vector length does not match the space's dimensions",
                details={"embedding_space_id": space.embedding_space_id, "dimensions": space.dimensions,
                         "vector_length": len(request.vector)})
        return Probe(space, list(request.vector), False)
    assert request.text is not None
    vector, truncated = await asyncio.to_thread(embed_query, space, request.text)
    # A text with nothing the model keeps (feature hashing of "!!!") embeds to zero: nothing to rank by.
    return Probe(space, vector if any(vector) else None, truncated)


def embed_query(space: SpaceRow, text: str) -> tuple[list[float], bool]:
    """The query text's vector in `space` and whether the model's window cut it. Runs in a thread: the
    model loads on first use and inference holds the CPU."""
    embedder = embedder_for(space.descriptor)
    if embedder is None:
        raise EmbeddingSpaceMismatch("this service cannot embed text for the space (no embedder for its model)",
                                     details={"embedding_space_id": space.embedding_space_id})
    cleaned = clean(text)
    overflows = getattr(embedder, "overflows", None)
    truncated = bool(overflows([cleaned])[0]) if overflows is not None else False
    return embedder.embed([cleaned])[0], truncated


async def nearest(conn: psycopg.AsyncConnection[Any], space: SpaceRow, vector: list[float], request: SearchRequest,
                  count: int, settings: QuerySettings) -> tuple[list[Any], Plan]:
    """The `count` nearest rows of the scope that pass the filters, inside the caller's snapshot.

    Rows: (meta, content, object_id, version_id, ledger_sequence, vector_version_id, distance, stale)."""
    threshold = settings.search_exact_threshold
    counted = max(threshold, settings.search_mid_threshold)  # counting stops there: 2.4 ms p50 at 20,000
    cur = await conn.execute(sql.SQL("SELECT count(*) FROM (SELECT 1 FROM {} WHERE scope_id = %s LIMIT %s) s")
                             .format(space.table), (request.scope_id, counted + 1))
    row = await cur.fetchone()
    size = int(row[0]) if row is not None else 0
    literal = vector_literal(vector)
    if size <= threshold:
        # Rank the scope's vectors first and read the projection rows of a shortlist only (reading all of a
        # scope's rows cost most of an exact search: they lie scattered over the heap). When the filters leave
        # fewer than `count` of the shortlist and the scope holds more, rank every vector instead.
        shortlist = max(4 * count, 100)
        cur = await conn.execute(*exact_statement(space, literal, request, count, shortlist))
        rows = await cur.fetchall()
        if len(rows) < count and size > shortlist:
            cur = await conn.execute(*exact_statement(space, literal, request, count, None))
            rows = await cur.fetchall()
        return _finite(rows), Plan("exact", None)
    # A mid-size scope is a small share of the index: a longer candidate list keeps its recall (python -m bench search).
    ef_search = settings.search_mid_ef_search if size <= settings.search_mid_threshold else settings.search_ef_search
    # enable_sort off: the planner must not trade the index for a scan and a sort of the whole scope
    # (it does for scopes it misjudges as small, or with a generic prepared plan: python -m bench search). One
    # round trip for the four settings.
    await conn.execute("SELECT set_config('hnsw.ef_search', %s, true), set_config('hnsw.iterative_scan',"
                       " 'relaxed_order', true), set_config('hnsw.max_scan_tuples', %s, true),"
                       " set_config('enable_sort', 'off', true)",
                       (str(ef_search), str(settings.search_max_scan_tuples)))
    # Relaxed order may hand candidates back slightly out of order: a few more than asked, re-ranked.
    statement, params = hnsw_statement(space, literal, request, count, max(4 * count, 40))
    plan = Plan("hnsw", ef_search)
    cur = await conn.execute(statement, params)
    return _finite(await cur.fetchall()), plan


def _finite(rows: list[Any]) -> list[Any]:
    """A stored zero vector (an object whose text embedded to nothing) has a NaN distance to everything: no
    rank, so it is never returned."""
    return [row for row in rows if math.isfinite(row[6])]


def exact_statement(space: SpaceRow, literal: str, request: SearchRequest, count: int,
                    shortlist: int | None) -> tuple[sql.Composed, list[Any]]:
    """Every vector of the scope compared (a MATERIALIZED CTE: the planner cannot use the HNSW index), the
    nearest `shortlist` of them (None: all) joined with the projection and filtered, the `count` nearest kept."""
    where, params = _filters(request)
    ranked = sql.SQL(
        "SELECT p.meta, p.content_digest, p.object_id, p.version_id, p.ledger_sequence,"
        " v.version_id AS vector_version_id, v.distance, v.version_sequence < p.sequence AS stale"
        " FROM v JOIN current_objects p ON p.scope_id = %s AND p.object_id = v.object_id"
        " WHERE {where} ORDER BY distance, p.object_id, p.version_id LIMIT %s"
    ).format(where=where)
    statement = sql.SQL(
        "WITH v AS MATERIALIZED (SELECT object_id, version_id, version_sequence, embedding <=> %s::vector AS distance"
        " FROM {t} WHERE scope_id = %s ORDER BY distance, object_id LIMIT %s) "
    ).format(t=space.table) + sql.SQL(_WITH_CONTENT).format(ranked=ranked)
    return statement, [literal, request.scope_id, shortlist, request.scope_id, *params, count]


def hnsw_statement(space: SpaceRow, literal: str, request: SearchRequest, count: int,
                   candidates: int) -> tuple[sql.Composed, list[Any]]:
    """HNSW candidates (iterative scan, scope and filters applied during the scan), re-ranked exactly."""
    where, params = _filters(request)
    ranked = sql.SQL(
        "SELECT * FROM (SELECT " + _COLUMNS + " FROM {t} v"
        " JOIN current_objects p ON p.scope_id = v.scope_id AND p.object_id = v.object_id"
        " WHERE v.scope_id = %s AND {where} ORDER BY v.embedding <=> %s::vector LIMIT %s) candidates"
        " ORDER BY distance, object_id, version_id LIMIT %s"
    ).format(t=space.table, where=where)
    return sql.SQL(_WITH_CONTENT).format(ranked=ranked), [literal, request.scope_id, *params, literal, candidates,
                                                          count]


def _filters(request: SearchRequest) -> tuple[sql.Composable, list[Any]]:
    clauses, params = filter_clauses(request)
    return (sql.SQL(" AND ").join(clauses) if clauses else sql.SQL("true")), params
