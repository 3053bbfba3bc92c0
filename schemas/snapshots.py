"""Evaluation snapshots (PAMSPEC 18.11, evaluation-snapshot.schema.json): the command that seals one, the
sealed descriptor, and its digest.

A snapshot pins a scope at a ledger sequence (`ledger_sequence_high_watermark`), optionally restricted to
named objects. The writer seals it: `sealed`, `created_at`, `created_by_actor_id` and the digest are the
writer's, whatever a client sends there. It is recorded as an event-only `index_rebuilt` entry with the
action `snapshot_sealed` (PAMSPEC's event types are a closed list; the same device as `scope_imported`), and
kept by id in the writer's `evaluation_snapshots` table for reads at it.
"""

from __future__ import annotations

import hashlib
from typing import Annotated, Any, Literal

import msgspec

from schemas.canonical import canonical_bytes
from schemas.common import COMMAND_STRUCT, Id, IdempotencyKey, Timestamp
from schemas.envelope import Actor

SNAPSHOT_ACTION = "snapshot_sealed"  # the index_rebuilt action that records a sealed snapshot
FROZEN_RULE = "evaluation_snapshot_membership_frozen"
DIGEST_ALGORITHM = "sha-256"
CANONICALIZATION = "pamledger-canonical-json"  # sorted keys, no whitespace, UTF-8 (schemas.canonical)
MAX_MEMBERS = 10_000
_DIGEST_FIELDS = ("digest", "digest_algorithm", "canonicalization_profile")


class DeterministicClock(msgspec.Struct, **COMMAND_STRUCT):
    clock_ref: Annotated[str, msgspec.Meta(min_length=1, max_length=512)]
    start_at: Timestamp
    tick_ms: Annotated[int, msgspec.Meta(ge=1, le=2**31 - 1)] | None = None


class SnapshotRequest(msgspec.Struct, **COMMAND_STRUCT):
    """A descriptor as a client sends it: evaluation-snapshot.schema.json with the writer's fields optional
    (a full descriptor decodes too). An unknown field or `sealed: false` is invalid_object."""

    snapshot_id: Id
    scope_id: Id | None = None  # when given, the command's scope
    sealed: Literal[True] = True
    ledger_sequence_high_watermark: Annotated[int, msgspec.Meta(le=2**63 - 1)] | None = None  # default: the head
    included_object_ids: Annotated[list[Id], msgspec.Meta(max_length=MAX_MEMBERS)] | None = None
    included_embedding_space_ids: Annotated[list[Id], msgspec.Meta(max_length=64)] | None = None
    deterministic_clock: DeterministicClock | None = None
    deterministic_rng_seed: Annotated[int, msgspec.Meta(ge=-(2**63), le=2**63 - 1)] | None = None
    evaluation_run_id: Id | None = None
    # The writer's: replaced by what it seals.
    created_at: Timestamp | None = None
    created_by_actor_id: Id | None = None
    digest: Annotated[str, msgspec.Meta(max_length=256)] | None = None
    digest_algorithm: Annotated[str, msgspec.Meta(max_length=64)] | None = None
    canonicalization_profile: Annotated[str, msgspec.Meta(max_length=128)] | None = None


class CreateSnapshot(msgspec.Struct, tag="snapshot_create", **COMMAND_STRUCT):
    """Seal an evaluation snapshot of one scope (needs `read` on it)."""

    scope_id: Id
    actor: Actor
    snapshot: SnapshotRequest
    operation_id: Id | None = None
    idempotency_key: IdempotencyKey | None = None


def snapshot_digest(descriptor: dict[str, Any]) -> str:
    """sha256 over the canonical JSON of the descriptor without its digest fields."""
    body = {k: v for k, v in descriptor.items() if k not in _DIGEST_FIELDS}
    return "sha256:" + hashlib.sha256(canonical_bytes(body)).hexdigest()


def with_digest(descriptor: dict[str, Any]) -> dict[str, Any]:
    return {**descriptor, "digest": snapshot_digest(descriptor), "digest_algorithm": DIGEST_ALGORITHM,
            "canonicalization_profile": CANONICALIZATION}
