"""The writer's reads of Postgres: the state a batch is decided against (heads, idempotency records, contents,
delegations, restorable content, scope policies, creation times, known scopes, an import's facts), each in one query for the
whole batch. Mixed into command_handler.store.PostgresLedgerStore, on the connection that holds the lock."""

from __future__ import annotations

from datetime import datetime
from typing import Any

import msgspec
import psycopg

from command_handler.core.state import ObjectHead
from infra.ledger import IdempotencyRow, LedgerRow
from infra.ledger_identity import ledger_identity
from schemas.canonical import decode_json
from schemas.delegation import DelegationState


class LedgerReads:
    conn: psycopg.AsyncConnection[Any]
    partition: int

    async def load_heads(self, keys: list[tuple[str, str]]) -> dict[tuple[str, str], ObjectHead]:
        if not keys:
            return {}
        cur = await self.conn.execute(
            "SELECT DISTINCT ON (v.scope_id, v.object_id) v.scope_id, v.object_id, v.version_id, v.sequence,"
            " v.meta, v.content_digest"
            " FROM memory_versions v JOIN unnest(%s::text[], %s::text[]) AS k(s, o)"
            " ON v.scope_id = k.s AND v.object_id = k.o"
            " ORDER BY v.scope_id, v.object_id, v.sequence DESC",
            ([k[0] for k in keys], [k[1] for k in keys]),
        )
        heads = {}
        for scope_id, object_id, version_id, sequence, meta, digest in await cur.fetchall():
            heads[(scope_id, object_id)] = ObjectHead(
                scope_id=scope_id, object_id=object_id, version_id=version_id, sequence=sequence,
                meta=decode_json(bytes(meta)), content_digest=digest,
            )
        return heads

    async def load_heads_at(self, scope_id: str, object_ids: list[str], at: int) -> dict[str, ObjectHead]:
        """Each object's newest version in `scope_id` at or before ledger sequence `at` (an evaluation run's
        fork: the snapshot's version of an object the run has not written)."""
        if not object_ids:
            return {}
        cur = await self.conn.execute(
            "SELECT DISTINCT ON (object_id) object_id, version_id, sequence, meta, content_digest FROM memory_versions"
            " WHERE scope_id = %s AND object_id = ANY(%s) AND ledger_sequence <= %s ORDER BY object_id, sequence DESC",
            (scope_id, object_ids, at))
        return {r[0]: ObjectHead(scope_id=scope_id, object_id=r[0], version_id=r[1], sequence=r[2],
                                 meta=decode_json(bytes(r[3])), content_digest=r[4]) for r in await cur.fetchall()}

    async def load_idempotency(self, keys: list[tuple[str, str]]) -> dict[tuple[str, str], IdempotencyRow]:
        if not keys:
            return {}
        cur = await self.conn.execute(
            "SELECT r.scope_id, r.idempotency_key, r.request_digest, r.object_id, r.version_id, r.ledger_sequence"
            " FROM idempotency_records r JOIN unnest(%s::text[], %s::text[]) AS k(s, i)"
            " ON r.scope_id = k.s AND r.idempotency_key = k.i",
            ([k[0] for k in keys], [k[1] for k in keys]),
        )
        return {
            (r[0], r[1]): IdempotencyRow(
                scope_id=r[0], idempotency_key=r[1], request_digest=r[2], object_id=r[3], version_id=r[4],
                ledger_sequence=r[5],
            )
            for r in await cur.fetchall()
        }

    async def load_contents(self, digests: list[str]) -> dict[str, bytes]:
        """Canonical content by digest (what a transition's reply envelope carries unchanged)."""
        if not digests:
            return {}
        cur = await self.conn.execute(
            "SELECT content_digest, content FROM content_store WHERE content_digest = ANY(%s)", (digests,))
        return {r[0]: bytes(r[1]) for r in await cur.fetchall()}

    async def load_delegations(self, ids: list[str]) -> dict[str, DelegationState]:
        if not ids:
            return {}
        cur = await self.conn.execute("SELECT delegation_id, scope_id, grant_object, uses, revoked FROM delegations"
                                      " WHERE delegation_id = ANY(%s)", (ids,))
        return {r[0]: DelegationState(delegation_id=r[0], scope_id=r[1], grant=msgspec.json.decode(bytes(r[2])),
                                      uses=int(r[3]), revoked=bool(r[4])) for r in await cur.fetchall()}

    async def sealed_snapshots(self, snapshot_ids: list[str]) -> set[str]:
        """Which of these evaluation snapshot ids are sealed (in any scope: the ids are the service's)."""
        if not snapshot_ids:
            return set()
        cur = await self.conn.execute("SELECT snapshot_id FROM evaluation_snapshots WHERE snapshot_id = ANY(%s)",
                                      (snapshot_ids,))
        return {r[0] for r in await cur.fetchall()}

    async def snapshot_descriptors(self, snapshot_ids: list[str]) -> dict[str, dict[str, Any]]:
        """The sealed descriptors of these snapshot ids (those sealed), for eval_start."""
        if not snapshot_ids:
            return {}
        cur = await self.conn.execute(
            "SELECT snapshot_id, descriptor FROM evaluation_snapshots WHERE snapshot_id = ANY(%s)", (snapshot_ids,))
        return {r[0]: msgspec.json.decode(bytes(r[1])) for r in await cur.fetchall()}

    async def evaluation_runs(self) -> list[tuple[dict[str, Any], int, bool]]:
        """Every evaluation run: its record, its scope's ledger entries, whether it ended."""
        cur = await self.conn.execute(
            "SELECT r.record, (SELECT count(*) FROM ledger l WHERE l.scope_id = r.scope_id AND l.partition = %s),"
            " r.ended_sequence IS NOT NULL FROM evaluation_runs r ORDER BY r.started_sequence", (self.partition,))
        return [(msgspec.json.decode(bytes(r[0])), int(r[1]), bool(r[2])) for r in await cur.fetchall()]

    async def load_restorable(self, keys: list[tuple[str, str]]) -> dict[tuple[str, str], str]:
        """Per object, the digest of its newest version that was available with content, where content storage
        still holds it (what a suppressing redaction hid and a restoration may bring back)."""
        if not keys:
            return {}
        cur = await self.conn.execute(
            "SELECT DISTINCT ON (v.scope_id, v.object_id) v.scope_id, v.object_id, v.content_digest"
            " FROM memory_versions v JOIN unnest(%s::text[], %s::text[]) AS k(s, o)"
            " ON v.scope_id = k.s AND v.object_id = k.o"
            " JOIN content_store c ON c.content_digest = v.content_digest"
            " WHERE convert_from(v.meta, 'UTF8')::jsonb ->> 'availability_state' = 'available'"
            " ORDER BY v.scope_id, v.object_id, v.sequence DESC",
            ([k[0] for k in keys], [k[1] for k in keys]),
        )
        return {(r[0], r[1]): r[2] for r in await cur.fetchall()}

    async def load_scope_policies(self, scope_ids: list[str]) -> dict[str, Any]:
        """Each existing scope's policy (None where it has none)."""
        if not scope_ids:
            return {}
        cur = await self.conn.execute("SELECT scope_id, policy FROM scopes WHERE scope_id = ANY(%s)", (scope_ids,))
        return {r[0]: r[1] for r in await cur.fetchall()}

    async def load_created_at(self, keys: list[tuple[str, str]]) -> dict[tuple[str, str], datetime]:
        """When each object was created: its first version's commit time (from the ledger row)."""
        if not keys:
            return {}
        cur = await self.conn.execute(
            "SELECT v.scope_id, v.object_id, l.recorded_at FROM memory_versions v"
            " JOIN unnest(%s::text[], %s::text[]) AS k(s, o) ON v.scope_id = k.s AND v.object_id = k.o"
            " JOIN ledger l ON l.partition = %s AND l.ledger_sequence = v.ledger_sequence WHERE v.sequence = 1",
            ([k[0] for k in keys], [k[1] for k in keys], self.partition))
        return {(r[0], r[1]): r[2] for r in await cur.fetchall()}

    async def first_sequences(self, keys: list[tuple[str, str]]) -> dict[tuple[str, str], int]:
        """The ledger sequence of each object's first version (when it came to be), for those that exist."""
        if not keys:
            return {}
        cur = await self.conn.execute(
            "SELECT v.scope_id, v.object_id, v.ledger_sequence FROM memory_versions v"
            " JOIN unnest(%s::text[], %s::text[]) AS k(s, o) ON v.scope_id = k.s AND v.object_id = k.o"
            " WHERE v.sequence = 1", ([k[0] for k in keys], [k[1] for k in keys]))
        return {(r[0], r[1]): int(r[2]) for r in await cur.fetchall()}

    async def load_import_facts(self, scope_ids: list[str], ids: list[str]) -> tuple[set[str], set[str]]:
        """Of `scope_ids`, those holding ledger entries; of `ids`, the event and version ids the ledger has."""
        if not (scope_ids or ids):
            return set(), set()
        cur = await self.conn.execute(
            "SELECT 's', s FROM unnest(%s::text[]) AS s WHERE EXISTS (SELECT 1 FROM ledger l WHERE l.scope_id = s)"
            " UNION ALL SELECT 'i', event_id FROM ledger WHERE event_id = ANY(%s)"
            " UNION ALL SELECT 'i', version_id FROM memory_versions WHERE version_id = ANY(%s)",
            (scope_ids, ids, ids))
        rows = await cur.fetchall()
        return {r[1] for r in rows if r[0] == "s"}, {r[1] for r in rows if r[0] == "i"}

    async def known_scopes(self, scope_ids: list[str]) -> set[str]:
        if not scope_ids:
            return set()
        cur = await self.conn.execute("SELECT scope_id FROM scopes WHERE scope_id = ANY(%s)", (scope_ids,))
        return {r[0] for r in await cur.fetchall()}

    async def identity(self) -> str:
        """This ledger partition's id (infra.ledger_identity: made with its first row)."""
        return await ledger_identity(self.conn, self.partition)

    async def erasing_rows(self, after: int, event_types: tuple[str, ...]) -> list[LedgerRow]:
        """The partition's ledger rows of these event types after a sequence, in order (the erasure journal's
        catch-up: command_handler.erasure_journal)."""
        cur = await self.conn.execute(
            "SELECT ledger_sequence, event_id, operation_id, scope_id, object_id, version_id, event_type,"
            " recorded_at, event, prev_hash, row_hash FROM ledger WHERE partition = %s AND ledger_sequence > %s"
            " AND event_type = ANY(%s) ORDER BY ledger_sequence", (self.partition, after, list(event_types)))
        return [LedgerRow(ledger_sequence=r[0], event_id=r[1], operation_id=r[2], scope_id=r[3], object_id=r[4],
                          version_id=r[5], event_type=r[6], recorded_at=r[7], event=bytes(r[8]),
                          prev_hash=bytes(r[9]), row_hash=bytes(r[10])) for r in await cur.fetchall()]
