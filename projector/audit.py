"""`pamledger audit --scope S --at N`: the scope exactly as it stood at ledger sequence N.

Answered from the immutable versions (never from the current tables), so the same N gives the same
state and digest after any number of later writes. Content is not part of the audit: only its salted
digest, because erasure may legitimately remove content later.
"""

from __future__ import annotations

import hashlib
from typing import Any

import psycopg

from infra.ledger import ledger_head
from infra.scopes import scope_exists
from schemas.canonical import canonical_bytes, decode_json
from schemas.errors import InvalidRequest, ScopeNotFound

_STATE_FIELDS = ("object_type", "lifecycle_state", "availability_state", "retention_state", "validation_state")


async def audit(conn: psycopg.AsyncConnection[Any], scope_id: str, at: int, partition: int) -> dict[str, Any]:
    head = await ledger_head(conn, partition)
    if at > head:
        raise InvalidRequest("--at is beyond the ledger head", details={"at": at, "ledger_head": head})
    if not await scope_exists(conn, scope_id):
        raise ScopeNotFound("scope not found", details={"scope_id": scope_id})
    cur = await conn.execute(
        "SELECT DISTINCT ON (object_id) object_id, version_id, sequence, ledger_sequence, meta, content_digest"
        " FROM memory_versions WHERE scope_id = %s AND ledger_sequence <= %s ORDER BY object_id, sequence DESC",
        (scope_id, at),
    )
    digest = hashlib.sha256()
    objects = []
    for object_id, version_id, sequence, ledger_sequence, meta, content_digest in await cur.fetchall():
        digest.update(canonical_bytes([bytes(meta).decode(), content_digest]) + b"\n")
        state = decode_json(bytes(meta))
        objects.append({"object_id": object_id, "version_id": version_id, "sequence": sequence,
                        "ledger_sequence": ledger_sequence, "versions": sequence,
                        **{name: state[name] for name in _STATE_FIELDS}})
    return {"scope_id": scope_id, "at_sequence": at, "objects": objects, "object_count": len(objects),
            "digest": "sha256:" + digest.hexdigest()}
