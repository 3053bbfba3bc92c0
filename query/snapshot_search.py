"""Search (semantic, lexical, hybrid) at a sealed evaluation snapshot: its members as they stood at its watermark.

Why apart from query.hybrid: a live search reads the projection and a space's live vector table (one row per
object, overwritten by newer versions, approximate above a size). A snapshot's answer must be the same bytes
after any later write, delete, re-embedding or new default space, so it reads only what never changes: the
immutable versions at the watermark (query.plan.temporal_source, with the same filters and the snapshot's
members) and the vectors kept per version (embedding.store.keep_vectors, joined by content digest), ranked
exactly by (distance, object_id, version_id). Lexical is query.plan.build at the watermark (objects unchanged
since read from the projection once it has passed the watermark: query.plan.temporal_sources); hybrid is the same
reciprocal rank fusion of both as live (query.hybrid.items).

The space searched: the request's `embedding_space_id` when the snapshot names it in
`included_embedding_space_ids` (a space it does not name is invalid_request); else the first it names; else
the space that was the default when the snapshot was sealed, read from the ledger (infra.ledger.
default_space_at), never the current default. A space registered after the seal is invalid_request.

Erasure still wins: erased content has no kept vector and no content row, and a later redaction hides it
(the temporal source), so it is gone from the answer, and the reply's `snapshot` report counts it.

The indexer keeps the vectors of every version it passes; a semantic or hybrid search waits (wait_ms) for it
to reach the watermark and for the space to be filled, then answers service_unavailable (retryable) rather
than fewer hits.
"""

from __future__ import annotations

from typing import Any

from psycopg import sql

from embedding.store import SpaceRow, find_space, vector_literal
from infra.ledger import default_space_at
from query.connections import Connections
from query.hybrid import TIE_BREAKS, applied_filters, candidate_count, index_block, items, lexical_request
from query.plan import build, filter_clauses, temporal_source
from query.search import CheckpointWatcher
from query.semantic import Probe, probe_in
from query.snapshot import snapshot
from query.snapshots import Pinned, SealedSnapshots, lost_statement, report_of
from schemas.canonical import canonical_bytes
from schemas.errors import InvalidRequest, ServiceUnavailable
from schemas.search import SearchRequest

# Rows: (meta, content, object_id, version_id, ledger_sequence, vector_version_id, distance, stale), as
# query.semantic's; never stale (the vector was made from this very content).
_NEAREST = (
    "{shortlist}SELECT r.meta, c.content, r.object_id, r.version_id, r.ledger_sequence, r.vector_version_id, r.distance, false"
    " FROM (SELECT p.meta, p.content_digest, p.object_id, p.version_id, p.ledger_sequence,"
    " k.version_id AS vector_version_id, {distance} AS distance"
    " FROM {source} p JOIN {kept} k"
    " ON k.scope_id = p.scope_id AND k.object_id = p.object_id AND k.content_digest = p.content_digest"
    " WHERE {where} ORDER BY distance, p.object_id, p.version_id LIMIT %s) r"
    " JOIN content_store c ON c.content_digest = r.content_digest"
    " ORDER BY r.distance, r.object_id, r.version_id")
# The nearest kept vectors of the scope's (members') objects, whatever version each was made from: only these
# rows are candidates, and only their objects' versions at the watermark are read (one index look-up each),
# not every version of the scope.
_SHORTLIST = ("WITH near AS MATERIALIZED (SELECT scope_id, object_id, content_digest, version_id,"
              " embedding <=> %s::vector AS distance FROM {kept} WHERE scope_id = %s{members}"
              " ORDER BY distance, object_id, content_digest LIMIT %s) ")
_SHORTLISTED = ("(SELECT w.* FROM (SELECT DISTINCT object_id FROM near) s CROSS JOIN LATERAL"
                " (SELECT * FROM memory_versions x WHERE x.scope_id = %s AND x.object_id = s.object_id"
                " AND x.ledger_sequence <= %s ORDER BY x.sequence DESC LIMIT 1) w)")


async def run_search_at_snapshot(pool: Connections, projection: CheckpointWatcher,
                                 index: CheckpointWatcher, request: SearchRequest,
                                 sealed: SealedSnapshots | None = None) -> bytes:
    assert request.snapshot_id is not None
    pin = await (sealed or SealedSnapshots()).pin(pool, request.scope_id, request.snapshot_id)
    space = None
    if request.mode != "lexical":
        async with pool.connection() as conn:
            space = await pinned_space(conn, pin, request)
    found = Probe(None, None, False)
    if space is not None:
        await _await_index(index, pin, space, request)
        found = await probe_in(space, request)
    count = candidate_count(request)
    async with pool.connection() as conn, snapshot(conn):
        semantic: list[Any] = []
        if found.space is not None and found.vector is not None:
            literal = vector_literal(found.vector)
            rows = await nearest_rows(conn, found.space, literal, request, pin, count)
            semantic = [row for row in rows if row[6] == row[6]]  # a NaN (zero vector) has no rank
        lexical: list[Any] = []
        if request.mode != "semantic" and request.text is not None:
            cur = await conn.execute(*build(lexical_request(request, count), None, pin.watermark, pin.members,
                                            projection.sequence >= pin.watermark))
            lexical = (await cur.fetchall())[:count]
        lost = await (await conn.execute(*lost_statement(pin))).fetchone()
    result: dict[str, Any] = {
        "items": items(request, lexical, semantic), "mode": request.mode, "tie_break": TIE_BREAKS[request.mode],
        "filters": applied_filters(request), "as_of_sequence": pin.watermark, "query_truncated": found.truncated,
        "embedding_space_id": space.embedding_space_id if space else None,
        "space_digest": space.space_digest if space else None,
        "index": None if request.mode == "lexical" else pinned_index(space, pin),
        "snapshot": report_of(pin, int(lost[0]) if lost else 0),
    }
    return canonical_bytes({"result": result})


async def pinned_space(conn: Any, pin: Pinned, request: SearchRequest) -> SpaceRow | None:
    """The space a search at this snapshot ranks by (see the module docstring); None: there was no default
    space when it was sealed, and the request names none."""
    named, wanted = pin.spaces, request.embedding_space_id
    if wanted is not None and named is not None and wanted not in named:
        raise InvalidRequest("the snapshot does not name this embedding space",
                             details={"embedding_space_id": wanted, "included_embedding_space_ids": named})
    space_id = wanted or (named[0] if named else await default_space_at(conn, pin.sealed_sequence))
    if space_id is None:
        return None
    space = await find_space(conn, space_id)
    if space is None or space.registered_sequence > pin.sealed_sequence:
        raise InvalidRequest("this embedding space was not registered when the snapshot was sealed",
                             details={"embedding_space_id": space_id})
    return space


async def _await_index(index: CheckpointWatcher, pin: Pinned, space: SpaceRow, request: SearchRequest) -> None:
    """The kept vectors are complete up to the watermark only once the indexer has passed it (and the space
    has been filled, for versions older than the space): wait, then refuse rather than answer fewer hits."""
    reached = index.sequence >= pin.watermark or await index.wait_for(pin.watermark, request.wait_ms / 1000)
    if not reached or space.state != "ready":
        raise ServiceUnavailable("the index has not yet kept every vector of this snapshot; retry",
                                 details={"snapshot_id": pin.descriptor["snapshot_id"], "index_checkpoint":
                                          index.sequence, "ledger_sequence_high_watermark": pin.watermark,
                                          "space_state": space.state})


async def nearest_rows(conn: Any, space: SpaceRow, literal: str, request: SearchRequest, pin: Pinned,
                       count: int) -> list[Any]:
    """The `count` nearest versions at the watermark: longer shortlists while the filters (or older versions'
    vectors) leave too few, at last every version there; each answers the same exact top (nearest_statement)."""
    rows: list[Any] = []
    for shortlist in (max(6 * count, 60), max(60 * count, 600), None):
        rows = await (await conn.execute(*nearest_statement(space, literal, request, pin, count, shortlist))).fetchall()
        if len(rows) >= count:
            break
    return rows


def nearest_statement(space: SpaceRow, literal: str, request: SearchRequest, pin: Pinned, count: int,
                      shortlist: int | None = None) -> tuple[sql.Composed, list[Any]]:
    """The `count` nearest versions at the watermark among the members that pass the filters, ranked exactly
    by their kept vectors; erased content (no content row) never takes a place.

    `shortlist`: only the scope's `shortlist` nearest kept vectors are candidates. An object has one version at
    the watermark, so one eligible kept vector at most, and (distance, object_id) orders the eligible ones
    totally: when the shortlist holds `count` eligible ones they are the exact top `count` (an eligible vector
    past the shortlist ranks after every one in it); when it holds fewer, the caller ranks every version
    instead (shortlist None)."""
    clauses, params = filter_clauses(request)
    clauses = [sql.SQL("EXISTS (SELECT 1 FROM content_store e WHERE e.content_digest = p.content_digest)"), *clauses]
    if pin.members is not None:
        clauses.append(sql.SQL("p.object_id = ANY(%s)"))
        params.append(pin.members)
    where = sql.SQL(" AND ").join(clauses)
    tail = [request.scope_id, pin.watermark, *params, count]
    if shortlist is None:
        statement = sql.SQL(_NEAREST).format(shortlist=sql.SQL(""), distance=sql.SQL("k.embedding <=> %s::vector"),
                                             source=temporal_source(False), kept=space.kept_table, where=where)
        return statement, [literal, *tail]
    members = sql.SQL(" AND object_id = ANY(%s)") if pin.members is not None else sql.SQL("")
    head = sql.SQL(_SHORTLIST).format(kept=space.kept_table, members=members)
    statement = sql.SQL(_NEAREST).format(shortlist=head, distance=sql.SQL("k.distance"),
                                         source=temporal_source(False, _SHORTLISTED), kept=sql.Identifier("near"),
                                         where=where)
    return statement, [literal, request.scope_id, *([pin.members] if pin.members is not None else []), shortlist,
                       *tail]


def pinned_index(space: SpaceRow | None, pin: Pinned) -> dict[str, Any]:
    """The `index` block at a snapshot: the space's identity, searched exactly at the watermark, whatever the
    live index's state and checkpoint are now."""
    block = index_block(space, "ready" if space else None, pin.watermark, None)
    if space is not None:
        block.update({"method": "exact", "approximate": False})
    return block
