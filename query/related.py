"""Query by relationship (query.related): the relationships around an object and the objects they reach.

Reads the projections (current_relationships, current_objects) in ONE repeatable-read snapshot, reports the
projection checkpoint as `as_of_sequence`, and walks breadth first, at most MAX_HOPS steps. Scope and
authorization are checked at every step (PAMSPEC 8.5, 15.7: a relationship reference grants nothing):
  - a relationship is seen only if the caller may read the scope it is stored in (a relationship stored in
    another scope that points INTO this one is found only then);
  - an object reached in another scope is shown, and walked on from, only if the caller may read that
    scope; otherwise the edge is kept (it is data of a scope the caller reads) and the object is
    `not_readable`: no envelope, no state, nothing looked up there, so nothing about it is disclosed;
  - an object that is gone is said to be gone (`deleted`, `redacted`, `not_found`), never hidden, and not
    walked on from.
Under a delegation, the walk stays in the request's scope (a delegation covers one scope).
The order is total (hop, then the relationship's ledger_sequence, newest first), so the same request over
the same state answers the same bytes.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import msgspec
import psycopg

from infra.projections import CHECKPOINT, checkpoint
from infra.scopes import SCOPE_EXISTS
from query.connections import Connections
from query.search import CheckpointWatcher
from query.snapshot import snapshot
from schemas.canonical import canonical_bytes, decode_json
from schemas.errors import ObjectNotFound, ScopeNotFound
from schemas.queries import RelatedRequest
from schemas.replies import envelope_bytes

MayRead = Callable[[str], bool]  # may the caller read this scope (the request's own is checked by the shell)
Node = tuple[str, str]  # (scope_id, object_id)

_START = f"SELECT {SCOPE_EXISTS}, {CHECKPOINT}"
# The relationships that touch the frontier: those whose source is a frontier object (stored in its scope)
# and those whose target is one (stored anywhere), filtered by the request's relationship filters, minus
# those already shown.
_TOUCHING = """
  FROM unnest(%(scopes)s::text[], %(ids)s::text[]) WITH ORDINALITY AS f(scope_id, object_id, ord)
  JOIN {rels} r ON (r.scope_id = f.scope_id AND r.source_object_id = f.object_id)
                               OR (r.target_scope_id = f.scope_id AND r.target_object_id = f.object_id)
  WHERE r.availability_state = ANY(%(availability)s)
    AND (%(types)s::text[] IS NULL OR r.relationship_type = ANY(%(types)s::text[]))
    AND (%(lifecycle)s::text[] IS NULL OR r.lifecycle_state = ANY(%(lifecycle)s::text[]))
    AND (%(retention)s::text[] IS NULL OR r.retention_state = ANY(%(retention)s::text[]))
    AND (%(validation)s::text[] IS NULL OR r.validation_state = ANY(%(validation)s::text[]))
    AND NOT EXISTS (SELECT 1 FROM unnest(%(seen_scopes)s::text[], %(seen_ids)s::text[]) AS s(scope_id, id)
                    WHERE s.scope_id = r.scope_id AND s.id = r.relationship_id)
"""
_AT_SOURCE = "(r.scope_id = f.scope_id AND r.source_object_id = f.object_id)"
# Which scopes other than the frontier's own hold relationships pointing at it: asked first, so the caller's
# grants rule each in or out and LIMIT counts only edges that will be shown.
_FOREIGN_SCOPES = "SELECT DISTINCT r.scope_id" + _TOUCHING + " AND r.scope_id <> f.scope_id ORDER BY 1"
# One row per relationship (found from the first frontier object, by its source end first), newest first;
# the content of the `limit` edges kept is fetched after the LIMIT, not for every edge that touches the frontier.
_EDGES = ("SELECT e.scope_id, e.relationship_id, e.ledger_sequence, e.source_object_id, e.target_scope_id,"
          " e.target_object_id, e.meta, c.content, e.from_scope, e.from_object, e.at_source FROM ("
          "SELECT * FROM (SELECT DISTINCT ON (r.scope_id, r.relationship_id) r.scope_id, r.relationship_id,"
          " r.ledger_sequence, r.source_object_id, r.target_scope_id, r.target_object_id, r.meta, r.content_digest,"
          " f.scope_id AS from_scope, f.object_id AS from_object, " + _AT_SOURCE + " AS at_source"
          + _TOUCHING +
          "   AND (r.scope_id = f.scope_id OR r.scope_id = ANY(%(foreign)s::text[]))"
          "   AND (%(direction)s = 'both' OR r.directionality <> 'directed'"
          "        OR (%(direction)s = 'outgoing') = " + _AT_SOURCE + ")"
          " ORDER BY r.scope_id, r.relationship_id, f.ord, " + _AT_SOURCE + " DESC"
          ") d ORDER BY ledger_sequence DESC LIMIT %(limit)s) e"
          " LEFT JOIN content_store c ON c.content_digest = e.content_digest ORDER BY e.ledger_sequence DESC")
_NODES = (
    "SELECT o.scope_id, o.object_id, o.availability_state, o.meta, c.content"
    " FROM unnest(%(node_scopes)s::text[], %(node_ids)s::text[]) AS n(scope_id, object_id)"
    " JOIN current_objects o ON o.scope_id = n.scope_id AND o.object_id = n.object_id"
    " LEFT JOIN content_store c ON c.content_digest = o.content_digest"
)
@dataclass(frozen=True)
class Source:
    """Where a walk reads relationships (`rels`, an SQL table or subquery with current_relationships' columns)
    and the objects it reaches (`nodes`, _NODES' row shape), with the named parameters they take: the live
    projection, or a sealed snapshot's versions at its watermark (query.related_snapshot)."""

    rels: str = "current_relationships"
    nodes: str = _NODES
    params: dict[str, Any] = field(default_factory=dict)


LIVE = Source()
_STOPS = frozenset({"deleted", "redacted", "not_found", "not_readable"})  # reached, but not walked on from


async def run_related(pool: Connections, watcher: CheckpointWatcher, request: RelatedRequest,
                      may_read: MayRead) -> bytes:
    reached = True
    if request.min_sequence is not None and watcher.sequence < request.min_sequence:
        reached = await watcher.wait_for(request.min_sequence, request.wait_ms / 1000)
    origin = (request.scope_id, request.from_object_id)
    walk = Walk(request, may_read)
    async with pool.connection() as conn, snapshot(conn):
        cur = await conn.execute(_START, (request.scope_id, watcher.checkpoint_name))
        known, as_of = await cur.fetchone() or (False, 0)
        if not known:
            raise ScopeNotFound("scope not found", details={"scope_id": request.scope_id})
        await walk.start(conn, origin)
    result = walk.result(as_of)
    if request.min_sequence is not None:
        result["min_sequence_reached"] = reached and as_of >= request.min_sequence
    return canonical_bytes({"result": result})


class Walk:
    """One breadth-first walk: the edges found (in order) and the nodes reached (each once, first hop)."""

    def __init__(self, request: RelatedRequest, may_read: MayRead, source: Source = LIVE):
        self.request = request
        self.may_read = may_read
        self.source = source
        self.edges: list[dict[str, Any]] = []
        self.nodes: dict[Node, dict[str, Any]] = {}
        self.seen: set[Node] = set()  # relationships shown: (scope_id, relationship_id)
        self.readable: dict[str, bool] = {request.scope_id: True}  # the shell authorized the request's scope
        self.truncated = False

    def can_read(self, scope_id: str) -> bool:
        if scope_id not in self.readable:
            self.readable[scope_id] = self.may_read(scope_id)
        return self.readable[scope_id]

    async def start(self, conn: psycopg.AsyncConnection[Any], origin: Node) -> None:
        """Find the origin (object_not_found when the source does not hold it), then walk from it."""
        params = {**self.source.params, "node_scopes": [origin[0]], "node_ids": [origin[1]]}
        row = await (await conn.execute(self.source.nodes, params)).fetchone()
        if row is None:
            raise ObjectNotFound("object not found in this scope", details={"object_id": origin[1]})
        self.nodes[origin] = _node(row, 0)
        await self.run(conn, origin)

    def result(self, as_of: int) -> dict[str, Any]:
        return {"from": {"scope_id": self.request.scope_id, "object_id": self.request.from_object_id},
                "edges": self.edges, "nodes": list(self.nodes.values()), "truncated": self.truncated,
                "as_of_sequence": as_of}

    async def run(self, conn: psycopg.AsyncConnection[Any], origin: Node) -> None:
        """Hop by hop from `origin` (whatever its state: a deleted object's relationships are still its own),
        then from each object reached that is readable and not gone."""
        frontier = [origin]
        for hop in range(1, self.request.hops + 1):
            if not frontier or self.truncated:
                return
            reached = await self._step(conn, frontier, hop)
            frontier = [node for node in reached if self.nodes[node]["endpoint_state"] not in _STOPS]

    async def _step(self, conn: psycopg.AsyncConnection[Any], frontier: list[Node], hop: int) -> list[Node]:
        """The edges of one hop, then the objects they reach for the first time (looked up where readable)."""
        params = self._params(frontier)
        cur = await conn.execute(_FOREIGN_SCOPES.format(rels=self.source.rels), params)
        params["foreign"] = [row[0] for row in await cur.fetchall() if self.can_read(row[0])]
        remaining = self.request.limit - len(self.edges)
        params["limit"] = remaining + 1
        rows = await (await conn.execute(_EDGES.format(rels=self.source.rels), params)).fetchall()
        if len(rows) > remaining:
            self.truncated, rows = True, rows[:remaining]
        new: list[Node] = []
        edges = []
        for scope_id, rel_id, _, source, target_scope, target, meta, content, at_scope, at_object, at_source in rows:
            self.seen.add((scope_id, rel_id))
            neighbour = (target_scope, target) if at_source else (scope_id, source)
            if neighbour not in self.nodes and neighbour not in new:
                new.append(neighbour)
            edges.append((neighbour, {
                "hop": hop, "direction": "outgoing" if at_source else "incoming",
                "at": {"scope_id": at_scope, "object_id": at_object},
                "relationship": msgspec.Raw(envelope_bytes(decode_json(bytes(meta)),
                                                           bytes(content) if content is not None else None)),
            }))
        await self._reach(conn, new, hop)
        for neighbour, edge in edges:
            state = self.nodes[neighbour]["endpoint_state"]
            self.edges.append({**edge, "neighbour": {"scope_id": neighbour[0], "object_id": neighbour[1],
                                                     "endpoint_state": state}})
        return new

    async def _reach(self, conn: psycopg.AsyncConnection[Any], new: list[Node], hop: int) -> None:
        """Nodes for the objects reached first at this hop: looked up only in scopes the caller may read."""
        readable = [node for node in new if self.can_read(node[0])]
        found: dict[Node, dict[str, Any]] = {}
        if readable:
            cur = await conn.execute(self.source.nodes, {**self.source.params, "node_scopes": [n[0] for n in readable],
                                                         "node_ids": [n[1] for n in readable]})
            found = {(row[0], row[1]): _node(row, hop) for row in await cur.fetchall()}
        for node in new:
            state = "not_found" if node in readable else "not_readable"
            self.nodes[node] = found.get(node) or {"scope_id": node[0], "object_id": node[1], "hop": hop,
                                                   "endpoint_state": state}

    def _params(self, frontier: list[Node]) -> dict[str, Any]:
        r = self.request
        seen = sorted(self.seen)
        return {**self.source.params, "scopes": [n[0] for n in frontier], "ids": [n[1] for n in frontier],
                "availability": list(r.availability_states), "types": r.relationship_types,
                "lifecycle": r.lifecycle_states, "retention": r.retention_states,
                "validation": r.validation_states, "direction": r.direction,
                "seen_scopes": [s[0] for s in seen], "seen_ids": [s[1] for s in seen], "foreign": [], "limit": 0}


def _node(row: Any, hop: int) -> dict[str, Any]:
    """A reached object: its availability as `endpoint_state`, and its envelope unless it is gone."""
    scope_id, object_id, availability, meta, content = row
    node: dict[str, Any] = {"scope_id": scope_id, "object_id": object_id, "hop": hop, "endpoint_state": availability}
    if availability not in _STOPS:
        node["envelope"] = msgspec.Raw(envelope_bytes(decode_json(bytes(meta)),
                                                      bytes(content) if content is not None else None))
    return node


async def relationship_refs(pool: Connections, scope_id: str, object_id: str) -> tuple[list[str], int]:
    """The ids of the relationships stored in `scope_id` that touch `object_id` (either end, deleted ones
    left out), and the projection checkpoint they were read at: the non-authoritative `relationship_refs`."""
    async with pool.connection() as conn, snapshot(conn):
        at = await checkpoint(conn)
        refs = await conn.execute(
            "SELECT relationship_id FROM current_relationships WHERE scope_id = %(s)s"
            " AND availability_state <> 'deleted' AND (source_object_id = %(o)s"
            "      OR (target_scope_id = %(s)s AND target_object_id = %(o)s)) ORDER BY relationship_id",
            {"s": scope_id, "o": object_id})
        return [str(r[0]) for r in await refs.fetchall()], at

