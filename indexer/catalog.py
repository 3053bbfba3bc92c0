"""The indexer's catalog (`index_catalog`): the current version of every object that may have a vector.

Why its own table: a fill covers the versions current before it started, and the live follower every later
one. The catalog is written by the follower in the same transaction as its checkpoint, so at checkpoint N it
holds exactly what was current at N; a fill reads it without waiting on the projector (it used to read the
projector's current_objects and wait for that follower's checkpoint to pass its start). Rows only move
forward: an older version never replaces a newer one, and an erasure deletes only rows it has seen.
"""

from __future__ import annotations

from typing import Any

import psycopg

from indexer.plan import Plan

_UPSERT = (
    "INSERT INTO index_catalog (scope_id, object_id, version_id, sequence, ledger_sequence, object_type,"
    " content_digest) SELECT * FROM unnest(%s::text[], %s::text[], %s::text[], %s::int[], %s::bigint[],"
    " %s::text[], %s::text[]) ON CONFLICT (scope_id, object_id) DO UPDATE SET version_id = excluded.version_id,"
    " sequence = excluded.sequence, ledger_sequence = excluded.ledger_sequence,"
    " object_type = excluded.object_type, content_digest = excluded.content_digest"
    " WHERE index_catalog.ledger_sequence < excluded.ledger_sequence")
_ERASE = (
    "DELETE FROM index_catalog c USING unnest(%s::text[], %s::text[]) AS e(scope_id, object_id)"
    " WHERE c.scope_id = e.scope_id AND c.object_id = e.object_id AND c.ledger_sequence <= %s")
_COLUMNS = "scope_id, object_id, version_id, sequence, ledger_sequence, object_type, content_digest"
# A fill's view: what was current at its start (`ledger_sequence <= start`), in key order after a cursor.
COUNT_UPTO_SQL = "SELECT count(*) FROM index_catalog WHERE ledger_sequence <= %s"
PAGE_UPTO_SQL = (f"SELECT {_COLUMNS} FROM index_catalog WHERE ledger_sequence <= %s"
                 " AND (scope_id, object_id) > (%s, %s) ORDER BY scope_id, object_id LIMIT %s")
# Coverage of a vector table (one `{}`: the table): vectors of a version that is no longer current, and
# current versions without a vector.
STALE_SQL = ("SELECT count(*) FROM {} t JOIN index_catalog c USING (scope_id, object_id)"
             " WHERE t.version_id <> c.version_id")
MISSING_SQL = ("SELECT count(*) FROM index_catalog c"
               " WHERE NOT EXISTS (SELECT 1 FROM {} t WHERE t.scope_id = c.scope_id AND t.object_id = c.object_id)")


async def apply_catalog(conn: psycopg.AsyncConnection[Any], plan: Plan) -> None:
    """Bring the catalog to the end of the batch `plan` folds: its erasures first (a partial redaction is
    both: the old version goes, the new one comes), then its current versions."""
    if plan.erased:
        keys = sorted(plan.erased)
        await conn.execute(_ERASE, ([k[0] for k in keys], [k[1] for k in keys], plan.through_sequence))
    if plan.versions:
        rows = sorted(plan.versions.values(), key=lambda v: v.key)
        await conn.execute(_UPSERT, (
            [v.scope_id for v in rows], [v.object_id for v in rows], [v.version_id for v in rows],
            [v.version_sequence for v in rows], [v.ledger_sequence for v in rows],
            [v.object_type for v in rows], [v.content_digest for v in rows]))
