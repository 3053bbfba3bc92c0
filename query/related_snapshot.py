"""Query by relationship at a sealed evaluation snapshot: the relationships between its members as they stood
at its watermark, from the immutable versions, so the answer is the same bytes after any later write.

Why from memory_versions and not current_relationships: the projection holds each relationship's current
version only. A Relationship Version's row is a function of its envelope (infra/sql/010_relationships.sql
backfills the projection the same way), so the walk reads, per relationship stored in the snapshot's scope,
its newest version at or before the watermark, and per object reached its newest version there.

What a snapshot holds: its scope only (a relationship stored in or pointing into another scope is not part
of it) and, when it names members, only relationships whose both ends are members. Erasure still wins: content
a later redaction hides is left out of envelopes (the reply's `snapshot` report counts it).
"""

from __future__ import annotations

from typing import Any


from infra.ledger import hidden_by_latest, latest_version
from query.connections import Connections
from query.related import MayRead, Source, Walk
from query.snapshot import snapshot
from query.snapshots import SealedSnapshots, lost_statement, report_of
from schemas.canonical import canonical_bytes
from schemas.queries import RelatedRequest

# Each relationship of the snapshot's scope as it stood at the watermark, in current_relationships' columns.
_RELATIONSHIPS_AT = """(
  SELECT v.scope_id, v.object_id AS relationship_id, v.ledger_sequence, m->>'relationship_type' AS relationship_type,
         m->>'source_object_id' AS source_object_id, coalesce(m->>'target_scope_id', m->>'scope_id') AS target_scope_id,
         m->>'target_object_id' AS target_object_id, m->>'directionality' AS directionality,
         m->>'lifecycle_state' AS lifecycle_state, m->>'availability_state' AS availability_state,
         m->>'retention_state' AS retention_state, m->>'validation_state' AS validation_state,
         CASE WHEN """ + hidden_by_latest("v") + """ THEN NULL ELSE v.content_digest END AS content_digest, v.meta
  FROM (SELECT DISTINCT ON (object_id) * FROM memory_versions
        WHERE scope_id = %(pin_scope)s AND ledger_sequence <= %(watermark)s ORDER BY object_id, sequence DESC) v
  CROSS JOIN LATERAL (SELECT convert_from(v.meta, 'UTF8')::jsonb AS m) j
  """ + latest_version("v") + """
  WHERE m ? 'relationship_id' AND coalesce(m->>'target_scope_id', m->>'scope_id') = %(pin_scope)s
    AND (%(members)s::text[] IS NULL OR (m->>'source_object_id' = ANY(%(members)s::text[])
                                         AND m->>'target_object_id' = ANY(%(members)s::text[])))
)"""
# The objects reached, each as its newest version at the watermark (a member of the snapshot's scope only).
_NODES_AT = (
    "SELECT n.scope_id, n.object_id, v.m->>'availability_state', v.meta,"
    " CASE WHEN " + hidden_by_latest("v") + " THEN NULL ELSE c.content END"
    " FROM unnest(%(node_scopes)s::text[], %(node_ids)s::text[]) AS n(scope_id, object_id)"
    " CROSS JOIN LATERAL (SELECT w.*, convert_from(w.meta, 'UTF8')::jsonb AS m FROM memory_versions w"
    "  WHERE w.scope_id = n.scope_id AND w.object_id = n.object_id AND w.ledger_sequence <= %(watermark)s"
    "  ORDER BY w.sequence DESC LIMIT 1) v "
    + latest_version("v") +
    " LEFT JOIN content_store c ON c.content_digest = v.content_digest"
    " WHERE v.m ? 'object_type' AND n.scope_id = %(pin_scope)s"
    " AND (%(members)s::text[] IS NULL OR n.object_id = ANY(%(members)s::text[]))"
)


async def run_related_at_snapshot(pool: Connections, request: RelatedRequest, may_read: MayRead,
                                  sealed: SealedSnapshots | None = None) -> bytes:
    assert request.snapshot_id is not None
    pin = await (sealed or SealedSnapshots()).pin(pool, request.scope_id, request.snapshot_id)
    source = Source(_RELATIONSHIPS_AT, _NODES_AT, {"pin_scope": request.scope_id, "watermark": pin.watermark,
                                                   "members": pin.members})
    walk = Walk(request, may_read, source)
    async with pool.connection() as conn, snapshot(conn):
        await walk.start(conn, (request.scope_id, request.from_object_id))
        lost = await (await conn.execute(*lost_statement(pin))).fetchone()
    result = walk.result(pin.watermark)
    result["snapshot"] = report_of(pin, int(lost[0]) if lost else 0)
    return canonical_bytes({"result": result})
