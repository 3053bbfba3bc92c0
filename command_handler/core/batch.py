"""What one group commit writes (Batch and its rows), the writer's storage port (LedgerStore), and the pure
rules every store applies alike: erasure inside a batch, forgotten request digests, the chain tail check.

Pure: no I/O. PostgresLedgerStore (command_handler/store.py) and InMemoryLedgerStore
(command_handler/memory_store.py) implement the port; tests/ledger_store_contract.py holds both to it.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any, Protocol

import msgspec

from command_handler.core.chain import GENESIS_HASH, row_hash
from command_handler.core.state import ObjectHead
from schemas.embedding import HandedVector
from infra.ledger import IdempotencyRow, LedgerRow
from schemas.delegation import DelegationState

# What an idempotency record's request_digest (`<whole>.<shape>`, command_handler.core.intake) becomes when its
# object's content is erased: `erased.<shape>`. The whole request's digest would let whoever reads the table
# confirm a guess of the content; the shape's (the request without its content) still tells a retry apart
# from another request under the same key.
ERASED_REQUEST = "erased"


def forgotten(digest: str) -> str:
    """A request digest with its content part forgotten."""
    return f"{ERASED_REQUEST}.{digest.partition('.')[2]}"
class VersionRow(msgspec.Struct, frozen=True, kw_only=True):
    scope_id: str
    object_id: str
    sequence: int
    version_id: str
    ledger_sequence: int
    meta: bytes
    content_digest: str | None


class ContentRow(msgspec.Struct, frozen=True, kw_only=True):
    content_digest: str
    scope_id: str
    object_id: str
    salt: bytes
    content: bytes


class SnapshotRow(msgspec.Struct, frozen=True, kw_only=True):
    """A sealed evaluation snapshot, by id (schemas.snapshots): written once, never changed."""

    snapshot_id: str
    scope_id: str
    ledger_sequence: int  # of the entry that sealed it
    descriptor: bytes  # canonical JSON of the sealed descriptor


class RunRow(msgspec.Struct, frozen=True, kw_only=True):
    """An evaluation run this batch starts (core.evaluation): its scope, id and record (canonical JSON)."""

    scope_id: str
    evaluation_run_id: str
    started_sequence: int  # of its evaluation_started entry
    record: bytes
    ended_sequence: int | None = None  # ended in the same batch (an UPDATE beside the INSERT would not see it)


class Batch(msgspec.Struct, kw_only=True):
    """Everything one group commit writes."""

    ledger: list[LedgerRow]
    versions: list[VersionRow]
    content: list[ContentRow]
    idempotency: list[IdempotencyRow]
    # (scope_id, object_id, keep, ledger_sequence): erase the object's stored content except the digest `keep`
    # (the content a partial redaction keeps; None for a full erasure) and forget the request digests of its
    # idempotency records written before the erasing entry at ledger_sequence
    erase: list[tuple[str, str, str | None, int]]
    scopes: list[tuple[str, str, str | None, str | None]]
    delegations: list[DelegationState] = []  # each changed delegation's state after the batch, once
    handoff: list[HandedVector] = []  # vectors imported versions bring for the indexer (embedding.handoff)
    snapshots: list[SnapshotRow] = []  # evaluation snapshots this batch seals
    runs: list[RunRow] = []  # evaluation runs this batch starts
    ended_runs: list[tuple[str, int]] = []  # (evaluation scope, the evaluation_ended entry's sequence)


class LedgerStore(Protocol):
    """The writer's port: the chain's tail, the reads a batch is decided against, the batch append.

    append keeps the whole batch or, raising, nothing of it. Implementations: PostgresLedgerStore, and
    command_handler.memory_store.InMemoryLedgerStore for tests of the core (tests/ledger_store_contract.py
    holds both to one behaviour)."""

    partition: int

    async def tail(self) -> tuple[int, bytes]: ...
    async def broken_tail(self, rows: int) -> str | None: ...
    async def load_heads(self, keys: list[tuple[str, str]]) -> dict[tuple[str, str], ObjectHead]: ...
    async def load_idempotency(self, keys: list[tuple[str, str]]) -> dict[tuple[str, str], IdempotencyRow]: ...
    async def load_restorable(self, keys: list[tuple[str, str]]) -> dict[tuple[str, str], str]: ...
    async def load_scope_policies(self, scope_ids: list[str]) -> dict[str, Any]: ...
    async def load_created_at(self, keys: list[tuple[str, str]]) -> dict[tuple[str, str], datetime]: ...
    async def known_scopes(self, scope_ids: list[str]) -> set[str]: ...
    async def sealed_snapshots(self, snapshot_ids: list[str]) -> set[str]: ...
    async def first_sequences(self, keys: list[tuple[str, str]]) -> dict[tuple[str, str], int]: ...
    async def snapshot_descriptors(self, snapshot_ids: list[str]) -> dict[str, dict[str, Any]]: ...
    async def evaluation_runs(self) -> list[tuple[dict[str, Any], int, bool]]: ...
    async def load_heads_at(self, scope_id: str, object_ids: list[str], at: int) -> dict[str, ObjectHead]: ...
    async def load_import_facts(self, scope_ids: list[str], ids: list[str]) -> tuple[set[str], set[str]]: ...
    async def load_contents(self, digests: list[str]) -> dict[str, bytes]: ...
    async def load_delegations(self, ids: list[str]) -> dict[str, DelegationState]: ...
    async def append(self, batch: Batch) -> None: ...


def last_erasures(batch: Batch) -> Batch:
    """The batch with one erasure per object, its last: it erases everything of the object but its `keep`
    (earlier erasures' kept projections included) and forgets every request digest before it, which is what
    the erasures one after another would have left. Two partial redactions of an object in one batch used to
    drop each other's projection, leaving the head's digest stored nowhere."""
    last: dict[tuple[str, str], tuple[str, str, str | None, int]] = {}
    for erasure in batch.erase:
        key = (erasure[0], erasure[1])
        if key not in last or erasure[3] > last[key][3]:
            last[key] = erasure
    return batch if len(last) == len(batch.erase) else msgspec.structs.replace(batch, erase=list(last.values()))


def kept_content(batch: Batch) -> list[ContentRow]:
    """The content rows of a batch (with one erasure per object: last_erasures) that outlive its erasures."""
    keep = {(e[0], e[1]): e[2] for e in batch.erase}
    return [c for c in batch.content
            if (c.scope_id, c.object_id) not in keep or keep[(c.scope_id, c.object_id)] == c.content_digest]


def tail_problem(rows: list[tuple[int, bytes, bytes, bytes]]) -> str | None:
    """rows: (ledger_sequence, event, prev_hash, row_hash) of the chain's last rows, oldest first."""
    for index, (seq, event, prev, stored) in enumerate(rows):
        if index and seq != rows[index - 1][0] + 1:
            return f"sequence gap before ledger row {seq}"
        expected_prev = rows[index - 1][3] if index else GENESIS_HASH if seq == 1 else prev
        if prev != expected_prev:
            return f"ledger row {seq}: prev_hash does not match the previous row's hash"
        if row_hash(prev, seq, event) != stored:
            return f"ledger row {seq}: row_hash does not match the row's bytes"
    return None
