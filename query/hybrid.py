"""Search: lexical, semantic, and both fused by reciprocal rank fusion; one snapshot, canonical reply bytes.

Reciprocal rank fusion (Cormack, Clarke and Buettcher, 2009): an object's fused score is the sum over the
lists that found it of 1 / (k + rank), rank from 1, with k = 60. Why RRF: the two scores are on unrelated
scales (ts_rank_cd is unbounded, cosine similarity lies in [-1, 1]), and ranks need no calibration; k = 60
damps the difference between the first few ranks so neither list dominates. Each list contributes its top
max(50, 5 * limit) candidates. Ties: fused score desc, object_id, version_id.

Freshness: every mode reads the projection (filters, envelopes), semantic and hybrid the vectors too;
`min_sequence` waits for the followers the mode reads (the projection alone for lexical, both otherwise)
and the reply reports both checkpoints, read in the same REPEATABLE READ snapshot as the rows.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any

import msgspec
from psycopg import sql

from embedding.store import SPACE_STATE, SpaceRow
from infra.projections import CHECKPOINT
from infra.scopes import SCOPE_EXISTS
from infra.settings import QuerySettings
from query.connections import Connections
from query.plan import build
from query.snapshot import snapshot
from query.search import CheckpointWatcher
from query.semantic import Plan, Probe, nearest, probe
from schemas.canonical import canonical_bytes, decode_json
from schemas.errors import ScopeNotFound
from schemas.queries import Filters, QueryRequest
from schemas.replies import envelope_bytes
from schemas.search import SearchRequest

RRF_K = 60
_STATE = sql.SQL(f"SELECT {SCOPE_EXISTS}, {CHECKPOINT}, {CHECKPOINT}, {SPACE_STATE}")
TIE_BREAKS = {
    "hybrid": ["fused_score desc", "object_id asc", "version_id asc"],
    "semantic": ["semantic_score desc", "object_id asc", "version_id asc"],
    "lexical": ["lexical_score desc", "ledger_sequence desc", "object_id desc", "version_id desc"],
}


@dataclass(frozen=True)
class Fused:
    object_id: str
    version_id: str
    score: float
    ranks: tuple[int | None, ...]  # 1-based rank in each input list, None where that list did not find it


def rrf(rankings: list[list[tuple[str, str]]], k: int = RRF_K) -> list[Fused]:
    """Fuse ranked lists of (object_id, version_id) by reciprocal rank; a total order (score, ids)."""
    ranks: dict[tuple[str, str], list[int | None]] = {}
    for i, ranking in enumerate(rankings):
        for rank, key in enumerate(ranking, start=1):
            ranks.setdefault(key, [None] * len(rankings))
            if ranks[key][i] is None:
                ranks[key][i] = rank
    fused = [Fused(key[0], key[1], sum(1.0 / (k + r) for r in found if r is not None), tuple(found))
             for key, found in ranks.items()]
    return sorted(fused, key=lambda f: (-f.score, f.object_id, f.version_id))


def candidate_count(request: SearchRequest) -> int:
    return request.limit if request.mode != "hybrid" else max(50, 5 * request.limit)


async def run_search(pool: Connections, projection: CheckpointWatcher, index: CheckpointWatcher,
                     request: SearchRequest, settings: QuerySettings,
                     fork: tuple[str, int, list[str] | None] | None = None) -> bytes:
    """One search; `fork`: the scope is an evaluation scope, which reads its snapshot's objects it has not
    written beside its own (query.fork_search, query.plan.fork_sources)."""
    reached = await _wait(request, projection, index)
    count = candidate_count(request)
    found = Probe(None, None, False)
    if request.mode != "lexical":
        async with pool.connection() as conn:  # given back while the text is embedded (a first use loads the model)
            found = await probe(conn, request)
    space_id = found.space.embedding_space_id if found.space else None
    async with pool.connection() as conn, snapshot(conn):
        cur = await conn.execute(_STATE, (request.scope_id, projection.checkpoint_name, index.checkpoint_name, space_id))
        known, projected, indexed, space_state = await cur.fetchone() or (False, 0, 0, None)
        semantic: list[Any] = []
        plan = None
        if known and found.space is not None and found.vector is not None:
            semantic, plan = await nearest(conn, found.space, found.vector, request, count, settings)
            if fork is not None:
                from query.fork_search import forked_nearest  # it builds on query.snapshot_search, which imports this
                semantic = await forked_nearest(conn, found.space, found.vector, request, fork, count, semantic)
        lexical: list[Any] = []
        if known and request.mode != "semantic" and request.text is not None:
            statement, params = build(lexical_request(request, count), None, None, None,
                                      fork is not None and projection.sequence >= fork[1], 0, fork)
            cur = await conn.execute(statement, params)
            lexical = (await cur.fetchall())[:count]
    if not known:
        raise ScopeNotFound("scope not found", details={"scope_id": request.scope_id})
    result: dict[str, Any] = {
        "items": items(request, lexical, semantic), "mode": request.mode, "tie_break": TIE_BREAKS[request.mode],
        "filters": applied_filters(request), "as_of_sequence": projected, "query_truncated": found.truncated,
        "embedding_space_id": space_id, "space_digest": found.space.space_digest if found.space else None,
        "index": None if request.mode == "lexical" else index_block(found.space, space_state, indexed, plan),
    }
    if request.min_sequence is not None:
        result["min_sequence_reached"] = reached and _fresh(request, request.min_sequence, projected, indexed)
    return canonical_bytes({"result": result})


async def _wait(request: SearchRequest, projection: CheckpointWatcher, index: CheckpointWatcher) -> bool:
    """Wait (up to wait_ms in all) for each follower this mode reads to reach min_sequence."""
    if request.min_sequence is None:
        return True
    # Every mode reads the projection (filters, envelopes); semantic and hybrid read the vectors too.
    watchers = [projection] if request.mode == "lexical" else [projection, index]
    loop = asyncio.get_running_loop()
    deadline = loop.time() + request.wait_ms / 1000
    reached = True
    for watcher in watchers:  # one deadline for all: hybrid waits wait_ms in all, not per follower
        if watcher.sequence < request.min_sequence:
            remaining = max(0.0, deadline - loop.time())
            reached = await watcher.wait_for(request.min_sequence, remaining) and reached
    return reached


def _fresh(request: SearchRequest, wanted: int, projected: int, indexed: int) -> bool:
    if request.mode == "lexical":
        return projected >= wanted
    return min(projected, indexed) >= wanted


def lexical_request(request: SearchRequest, count: int) -> QueryRequest:
    """The full-text Query (order by score) with the search's filters: query.plan builds its SQL."""
    filters = {name: getattr(request, name) for name in Filters.__struct_fields__}
    return QueryRequest(scope_id=request.scope_id, text=request.text, order="score", limit=count, **filters)


def applied_filters(request: SearchRequest) -> dict[str, Any]:
    return {name: msgspec.to_builtins(getattr(request, name)) for name in Filters.__struct_fields__
            if getattr(request, name) is not None}


def index_block(space: SpaceRow | None, state: str | None, checkpoint: int, plan: Plan | None) -> dict[str, Any]:
    """The index's identity, its freshness and how it was searched; no space at all reads as still filling.

    The identity names the space's vector table and the ledger entry that registered the space."""
    identity = f"pamledger:vectors:{space.space_key}@{space.registered_sequence}" if space else None
    return {"index_id": identity, "state": state or "filling", "checkpoint": checkpoint,
            "method": plan.method if plan else None, "approximate": plan is not None and plan.method == "hnsw",
            "ef_search": plan.ef_search if plan else None}


def items(request: SearchRequest, lexical: list[Any], semantic: list[Any]) -> list[dict[str, Any]]:
    """The page: each object once, in the mode's order, with every score and rank (null where not found).

    Lexical rows: (meta, content, rank, ledger_sequence, object_id, version_id) from query.plan;
    semantic rows: (meta, content, object_id, version_id, ledger_sequence, vector_version_id, distance, stale)."""
    lex = {(r[4], r[5]): (i, r) for i, r in enumerate(lexical, start=1)}
    sem = {(r[2], r[3]): (i, r) for i, r in enumerate(semantic, start=1)}
    fused = rrf([list(lex), list(sem)])
    if request.mode == "lexical":
        fused = [Fused(o, v, 0.0, (rank, None)) for (o, v), (rank, _) in lex.items()]
    elif request.mode == "semantic":
        fused = [Fused(o, v, 0.0, (None, rank)) for (o, v), (rank, _) in sem.items()]
    out = []
    for hit in fused[: request.limit]:
        key = (hit.object_id, hit.version_id)
        lrow, srow = lex.get(key, (0, None))[1], sem.get(key, (0, None))[1]
        row = srow if srow is not None else lrow
        assert row is not None
        out.append({
            "object_id": hit.object_id, "version_id": hit.version_id,
            "envelope": msgspec.Raw(envelope_bytes(decode_json(bytes(row[0])), bytes(row[1]) if row[1] else None)),
            "ledger_sequence": srow[4] if srow is not None else lrow[3],
            "lexical_score": float(lrow[2]) if lrow is not None else None, "lexical_rank": hit.ranks[0],
            "semantic_score": 1.0 - float(srow[6]) if srow is not None else None, "semantic_rank": hit.ranks[1],
            "fused_score": hit.score if request.mode == "hybrid" else None,
            "vector_version_id": srow[5] if srow is not None else None,
            "stale": bool(srow[7]) if srow is not None else None,
        })
    return out
