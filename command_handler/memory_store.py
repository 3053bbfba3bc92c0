"""LedgerStore in dicts: what PostgresLedgerStore keeps in its tables, for tests of the writer's core.

Why: decide and plan_batch can then be driven batch after batch through a store's reads and its atomic
append (conflicts, erasure, the chain's tail) in microseconds, with no Postgres. tests/ledger_store_contract.py
holds this store and PostgresLedgerStore to one behaviour, so the fast tier says what Postgres would do.
Pure Python: no I/O; the methods are async only because the Protocol's are.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime
from typing import Any

import msgspec

from command_handler.core.chain import GENESIS_HASH
from command_handler.core.state import ObjectHead
from schemas.embedding import HandedVector
from command_handler.core.batch import (
    Batch, ContentRow, RunRow, SnapshotRow, VersionRow, forgotten, kept_content, last_erasures, tail_problem,
)
from infra.ledger import IdempotencyRow, LedgerRow
from schemas.canonical import decode_json
from schemas.common import SYSTEM_SCOPE
from schemas.delegation import DelegationState

# The Postgres constraints this store keeps, by their names there (a refusal names the one it broke, as
# psycopg's diag.constraint_name does), so a caller can tell an idempotency key seen before from a bug.
LEDGER_SEQUENCE = "ledger_pkey"
EVENT_ID = "ledger_event_id_key"
OBJECT_SEQUENCE = "memory_versions_pkey"
VERSION_ID = "memory_versions_version_id_key"
CONTENT_DIGEST = "content_store_pkey"
IDEMPOTENCY_KEY = "idempotency_records_pkey"
DELEGATION_ID = "delegations_pkey"
SNAPSHOT_ID = "evaluation_snapshots_pkey"
RUN_SCOPE = "evaluation_runs_pkey"
RUN_ID = "evaluation_runs_evaluation_run_id_key"
POSITIVE_LEDGER_SEQUENCE = "ledger_ledger_sequence_check"
POSITIVE_SEQUENCE = "memory_versions_sequence_check"
VERSION_OR_ENTRY = "idempotency_records_version_or_entry"
NON_NEGATIVE_USES = "delegations_uses_check"


class StoreRefused(Exception):
    """A batch the store refused as a whole (nothing of it was kept): `constraint` names the rule it broke."""

    def __init__(self, constraint: str, detail: str):
        super().__init__(f"{constraint}: {detail}")
        self.constraint = constraint


class ScopeRow(msgspec.Struct, frozen=True, kw_only=True):
    scope_id: str
    scope_kind: str
    parent_scope_id: str | None
    policy: str | None  # canonical JSON text, as the batch carries it


class InMemoryLedgerStore:
    """The ledger, versions, content, idempotency records, scopes and delegations of one partition, in dicts.

    A new store is a freshly migrated database: it knows the system scope and holds no rows. The tables are
    public for tests to look at; only append writes them.
    """

    def __init__(self, partition: int = 0) -> None:
        self.partition = partition
        self.ledger: dict[int, LedgerRow] = {}
        self.versions: dict[tuple[str, str, int], VersionRow] = {}
        self.content: dict[str, ContentRow] = {}
        self.idempotency: dict[tuple[str, str], IdempotencyRow] = {}
        self.scopes: dict[str, ScopeRow] = {
            SYSTEM_SCOPE: ScopeRow(scope_id=SYSTEM_SCOPE, scope_kind="system", parent_scope_id=None, policy=None)}
        self.delegations: dict[str, DelegationState] = {}
        self.snapshots: dict[str, SnapshotRow] = {}
        self.runs: dict[str, RunRow] = {}  # evaluation runs by their scope
        self.handoff: list[HandedVector] = []  # vectors imports handed to the indexer (no indexer here)
        self._event_ids: set[str] = set()
        self._version_ids: set[str] = set()
        self._sequences: dict[tuple[str, str], list[int]] = {}  # per object, its versions' sequences ascending

    async def tail(self) -> tuple[int, bytes]:
        if not self.ledger:
            return 0, GENESIS_HASH
        last = self.ledger[max(self.ledger)]
        return last.ledger_sequence, last.row_hash

    async def broken_tail(self, rows: int) -> str | None:
        last = sorted(self.ledger)[-rows:] if rows > 0 else []
        return tail_problem([(seq, self.ledger[seq].event, self.ledger[seq].prev_hash, self.ledger[seq].row_hash)
                             for seq in last])

    async def load_heads(self, keys: list[tuple[str, str]]) -> dict[tuple[str, str], ObjectHead]:
        heads = {}
        for key in keys:
            if key in self._sequences:
                row = self.versions[(*key, self._sequences[key][-1])]
                heads[key] = ObjectHead(scope_id=row.scope_id, object_id=row.object_id, version_id=row.version_id,
                                        sequence=row.sequence, meta=decode_json(row.meta),
                                        content_digest=row.content_digest)
        return heads

    async def load_heads_at(self, scope_id: str, object_ids: list[str], at: int) -> dict[str, ObjectHead]:
        found = {}
        for object_id in object_ids:
            rows = [self.versions[(scope_id, object_id, n)] for n in self._sequences.get((scope_id, object_id), [])]
            rows = [r for r in rows if r.ledger_sequence <= at]
            if rows:
                row = rows[-1]
                found[object_id] = ObjectHead(scope_id=scope_id, object_id=object_id, version_id=row.version_id,
                                              sequence=row.sequence, meta=decode_json(row.meta),
                                              content_digest=row.content_digest)
        return found

    async def load_idempotency(self, keys: list[tuple[str, str]]) -> dict[tuple[str, str], IdempotencyRow]:
        return {key: self.idempotency[key] for key in keys if key in self.idempotency}

    async def load_contents(self, digests: list[str]) -> dict[str, bytes]:
        return {digest: self.content[digest].content for digest in digests if digest in self.content}

    async def load_delegations(self, ids: list[str]) -> dict[str, DelegationState]:
        return {i: _copied(self.delegations[i]) for i in ids if i in self.delegations}

    async def sealed_snapshots(self, snapshot_ids: list[str]) -> set[str]:
        return {i for i in snapshot_ids if i in self.snapshots}

    async def snapshot_descriptors(self, snapshot_ids: list[str]) -> dict[str, dict[str, Any]]:
        return {i: decode_json(self.snapshots[i].descriptor) for i in snapshot_ids if i in self.snapshots}

    async def evaluation_runs(self) -> list[tuple[dict[str, Any], int, bool]]:
        return [(decode_json(r.record), sum(1 for row in self.ledger.values() if row.scope_id == r.scope_id),
                 r.ended_sequence is not None) for r in sorted(self.runs.values(), key=lambda r: r.started_sequence)]

    async def load_restorable(self, keys: list[tuple[str, str]]) -> dict[tuple[str, str], str]:
        """Per object, the digest of its newest version that was available with content still stored."""
        found = {}
        for key in keys:
            for sequence in reversed(self._sequences.get(key, [])):
                row = self.versions[(*key, sequence)]
                available = decode_json(row.meta).get("availability_state") == "available"
                if available and row.content_digest in self.content:
                    found[key] = row.content_digest
                    break
        return found

    async def load_scope_policies(self, scope_ids: list[str]) -> dict[str, Any]:
        return {s: _policy(self.scopes[s]) for s in scope_ids if s in self.scopes}

    async def load_created_at(self, keys: list[tuple[str, str]]) -> dict[tuple[str, str], datetime]:
        found = {}
        for key in keys:
            first = self.versions.get((*key, 1))
            row = self.ledger.get(first.ledger_sequence) if first is not None else None
            if row is not None:
                found[key] = row.recorded_at
        return found

    async def first_sequences(self, keys: list[tuple[str, str]]) -> dict[tuple[str, str], int]:
        return {key: self.versions[(*key, 1)].ledger_sequence for key in keys if (*key, 1) in self.versions}

    async def known_scopes(self, scope_ids: list[str]) -> set[str]:
        return {s for s in scope_ids if s in self.scopes}

    async def load_import_facts(self, scope_ids: list[str], ids: list[str]) -> tuple[set[str], set[str]]:
        occupied = {row.scope_id for row in self.ledger.values()} & set(scope_ids)
        return occupied, {i for i in ids if i in self._event_ids or i in self._version_ids}

    async def append(self, batch: Batch) -> None:
        """Keep the whole batch or, raising StoreRefused, nothing of it: every rule is checked before any
        table moves. Content of an object the batch erases is not kept (but the digest the erasure keeps);
        the erasure deletes the object's stored content and forgets the request digests of its idempotency
        records written before the erasing entry, as PostgresLedgerStore.append does."""
        batch = last_erasures(batch)
        content = kept_content(batch)
        self._check(batch, content)
        self._keep(batch, content)
        self.handoff.extend(batch.handoff)
        for scope_id, object_id, keep, seq in batch.erase:
            for digest in [d for d, c in self.content.items() if (c.scope_id, c.object_id) == (scope_id, object_id)
                           and d != keep]:
                del self.content[digest]
            for key, record in self.idempotency.items():
                if (record.scope_id, record.object_id) == (scope_id, object_id) and record.ledger_sequence < seq:
                    self.idempotency[key] = msgspec.structs.replace(record, request_digest=forgotten(
                        record.request_digest))

    def _check(self, batch: Batch, content: list[ContentRow]) -> None:
        """Raise StoreRefused for the first rule the batch breaks, against the store and within itself."""
        _unique(LEDGER_SEQUENCE, self.ledger, (r.ledger_sequence for r in batch.ledger))
        _unique(EVENT_ID, self._event_ids, (r.event_id for r in batch.ledger))
        _unique(OBJECT_SEQUENCE, self.versions, ((v.scope_id, v.object_id, v.sequence) for v in batch.versions))
        _unique(VERSION_ID, self._version_ids, (v.version_id for v in batch.versions))
        _unique(CONTENT_DIGEST, self.content, (c.content_digest for c in content))
        _unique(IDEMPOTENCY_KEY, self.idempotency, ((r.scope_id, r.idempotency_key) for r in batch.idempotency))
        _unique(DELEGATION_ID, set(), (d.delegation_id for d in batch.delegations))  # twice in one batch
        _unique(SNAPSHOT_ID, self.snapshots, (r.snapshot_id for r in batch.snapshots))
        _unique(RUN_SCOPE, self.runs, (r.scope_id for r in batch.runs))
        _unique(RUN_ID, {r.evaluation_run_id for r in self.runs.values()}, (r.evaluation_run_id for r in batch.runs))
        _holds(POSITIVE_LEDGER_SEQUENCE, all(r.ledger_sequence >= 1 for r in batch.ledger))
        _holds(POSITIVE_SEQUENCE, all(v.sequence >= 1 for v in batch.versions))
        _holds(VERSION_OR_ENTRY, all((r.object_id is None) == (r.version_id is None) for r in batch.idempotency))
        _holds(NON_NEGATIVE_USES, all(d.uses >= 0 for d in batch.delegations))

    def _keep(self, batch: Batch, content: list[ContentRow]) -> None:
        """Write the checked batch's rows (nothing here can fail)."""
        for scope_id, kind, parent, policy in batch.scopes:
            self.scopes.setdefault(scope_id, ScopeRow(scope_id=scope_id, scope_kind=kind, parent_scope_id=parent,
                                                      policy=policy))  # a known scope keeps its first row
        for row in batch.ledger:
            self.ledger[row.ledger_sequence] = row
            self._event_ids.add(row.event_id)
        for version in batch.versions:
            self.versions[(version.scope_id, version.object_id, version.sequence)] = version
            self._version_ids.add(version.version_id)
            sequences = self._sequences.setdefault((version.scope_id, version.object_id), [])
            sequences.append(version.sequence)
            sequences.sort()
        self.content.update((c.content_digest, c) for c in content)
        self.idempotency.update(((r.scope_id, r.idempotency_key), r) for r in batch.idempotency)
        self.snapshots.update((r.snapshot_id, r) for r in batch.snapshots)
        self.runs.update((r.scope_id, r) for r in batch.runs)
        for scope_id, sequence in batch.ended_runs:
            self.runs[scope_id] = msgspec.structs.replace(self.runs[scope_id], ended_sequence=sequence)
        for state in batch.delegations:
            known = self.delegations.get(state.delegation_id)  # a known delegation changes its uses and revoked only
            self.delegations[state.delegation_id] = _copied(state) if known is None else msgspec.structs.replace(
                known, uses=state.uses, revoked=state.revoked)


def _unique(constraint: str, existing: Any, keys: Iterable[Any]) -> None:
    """Refuse a key the store holds (`existing` supports `in`) or the batch repeats."""
    seen = set()
    for key in keys:
        if key in existing or key in seen:
            raise StoreRefused(constraint, f"duplicate key {key!r}")
        seen.add(key)


def _holds(constraint: str, holds: bool) -> None:
    if not holds:
        raise StoreRefused(constraint, "a row of the batch breaks the check")


def _policy(scope: ScopeRow) -> Any:
    return decode_json(scope.policy) if scope.policy is not None else None


def _copied(state: DelegationState) -> DelegationState:
    """A delegation state sharing nothing mutable with the caller's (its grant is a dict), as a read of a
    table would be."""
    return msgspec.json.decode(msgspec.json.encode(state), type=DelegationState)
