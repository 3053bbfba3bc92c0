"""The shapes of the service's replies, as the SDK returns them: plain dicts (decoded JSON), typed for editors
and type checkers. `total=False` where a field is present only in some replies (docs/protocol.md says when).

Why TypedDicts and not classes: a reply is exactly the JSON the service sent, so code written against the NATS
binding in another language reads the same keys; nothing is converted or dropped.
"""

from __future__ import annotations

from typing import Any, TypedDict

from pamledger_client.protocol.vocabulary import (
    AvailabilityState,
    LifecycleState,
    RetentionState,
    ValidationState,
)


class _ActorRequired(TypedDict):
    actor_id: str
    actor_kind: str


class Actor(_ActorRequired, total=False):
    """Who acts: `{actor_id, actor_kind}` and, for a delegate, whom it acts for."""

    display_name: str
    on_behalf_of_actor_id: str
    delegation_id: str


class Provenance(TypedDict, total=False):
    provenance_id: str
    actor: Actor
    activity: str
    recorded_at: str
    source_ref: str
    evidence_refs: list[str]
    observed_at: str


class MemoryEnvelope(TypedDict, total=False):
    """One Memory Version as PAMSPEC's memory-object.schema.json has it (read, query items, history)."""

    spec_version: str
    object_id: str
    version_id: str
    scope_id: str
    object_type: str
    schema_id: str
    canonical_content: Any  # null once erased; {"tombstone": true} for a deletion
    lifecycle_state: LifecycleState
    availability_state: AvailabilityState
    retention_state: RetentionState
    validation_state: ValidationState
    committed_at: str
    recorded_at: str
    sequence: int
    actor: Actor
    provenance: Provenance
    observed_at: str
    asserted_at: str
    valid_from: str
    valid_until: str
    relationship_refs: list[str]
    integrity: dict[str, Any]
    quality_signals: dict[str, Any]
    # read at a snapshot (`snapshot_id`) answers {envelope, snapshot} instead of the envelope alone
    envelope: MemoryEnvelope
    snapshot: dict[str, Any]


class WriteResult(TypedDict, total=False):
    """A committed write (create, update, transition, delete, relate, redact, promote, ...)."""

    object_id: str
    relationship_id: str  # a Relationship Version's id (relate)
    version_id: str
    sequence: int  # the object's version number
    ledger_sequence: int  # where the write sits in the ledger: read-your-writes asks for it (min_sequence)
    through_sequence: int  # a command of several entries (promote, an import chunk): its last entry's sequence
    event_id: str
    envelope: MemoryEnvelope
    idempotency_result: str  # "replayed_original_result" when an idempotency key replayed an earlier write


class QueryItem(TypedDict, total=False):
    envelope: MemoryEnvelope
    ledger_sequence: int
    score: float  # order "score" (lexical text)


class QueryPage(TypedDict, total=False):
    """One page of Query: `next_cursor` asks for the next (None on the last)."""

    items: list[QueryItem]
    next_cursor: str | None
    as_of_sequence: int  # the projection position the page was read at
    order: str
    min_sequence_reached: bool
    snapshot: dict[str, Any]


class SearchHit(TypedDict, total=False):
    object_id: str
    version_id: str
    envelope: MemoryEnvelope
    ledger_sequence: int
    lexical_score: float | None
    lexical_rank: int | None
    semantic_score: float | None
    semantic_rank: int | None
    fused_score: float | None
    vector_version_id: str | None


class SearchPage(TypedDict, total=False):
    """Search's answer: the hits, the space and index that answered and how fresh they were."""

    items: list[SearchHit]
    mode: str
    tie_break: list[str]
    filters: dict[str, Any]
    as_of_sequence: int
    query_truncated: bool
    embedding_space_id: str
    space_digest: str | None
    index: dict[str, Any] | None
    min_sequence_reached: bool
    snapshot: dict[str, Any]


class History(TypedDict, total=False):
    """Inspect History: the versions oldest first and the object's ledger events."""

    object_id: str
    scope_id: str
    versions: list[MemoryEnvelope]
    events: list[dict[str, Any]]
    snapshot: dict[str, Any]
