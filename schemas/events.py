"""Ledger events: facts in the past tense, shaped like memory-event.schema.json, one Struct per event type.

`Event` is a tagged union on `event_type`; each member says what its `payload` holds. A Memory Version's
event carries its envelope (`ObjectEnvelope`: MemoryVersion without canonical_content, since events carry
digests, never content, so erasure never has to touch the ledger); a Relationship Version's carries a
`RelationshipEnvelope`; a transition, a deletion or a redaction, which may name either, an `AnyEnvelope`
(every field of both). A ledger row's bytes are the canonical JSON of one Event: the writer builds them
(`event_of`), and a ledger written before these types decodes into them and encodes back to its very bytes
(tests/integration/test_old_ledger.py).

Readers do not decode whole events: each follower declares the part it reads as a partial view in
schemas/event_views.py, tolerant of fields it does not know (old readers read new data), and tested to be
a field subset of these types.
"""

from __future__ import annotations

from typing import Any, Literal

import msgspec

from schemas.common import Timestamp
from schemas.embedding import EmbeddingSpace
from schemas.envelope import Actor, Integrity, Provenance, QualitySignals
from schemas.errors import InvalidRequest

EventType = Literal[
    "object_created",
    "object_updated",
    "lifecycle_transitioned",
    "availability_transitioned",
    "retention_transitioned",
    "validation_transitioned",
    "relationship_created",
    "relationship_updated",
    "provenance_updated",
    "embedding_generated",
    "index_rebuilt",
    "access_denied",
    "object_redacted",
    "object_deleted",
    "working_memory_promoted",
    "tool_invoked",
    "tool_completed",
    "subscription_opened",
    "subscription_closed",
    "delegation_granted",
    "delegation_revoked",
    "delegation_exercised",
]

TRANSITION_EVENT: dict[str, EventType] = {
    "lifecycle": "lifecycle_transitioned",
    "availability": "availability_transitioned",
    "retention": "retention_transitioned",
    "validation": "validation_transitioned",
}

# --- envelopes: what a version's event says of it (timestamps as the writer wrote them) -------------------

class _EnvelopeCore(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    spec_version: str
    version_id: str
    scope_id: str
    sequence: int
    lifecycle_state: str
    availability_state: str
    retention_state: str
    validation_state: str
    committed_at: str
    recorded_at: str
    actor: Actor
    provenance: Provenance
    observed_at: str | None = None
    asserted_at: str | None = None
    valid_from: str | None = None
    valid_until: str | None = None
    integrity: Integrity | None = None


class ObjectEnvelope(_EnvelopeCore, frozen=True, kw_only=True, omit_defaults=True):
    """A Memory Version's envelope: MemoryVersion (schemas.envelope) without canonical_content."""

    object_id: str
    object_type: str
    schema_id: str | None = None
    relationship_refs: list[str] | None = None
    quality_signals: QualitySignals | None = None


class RelationshipEnvelope(_EnvelopeCore, frozen=True, kw_only=True, omit_defaults=True):
    """A Relationship Version's envelope: relationship.schema.json without canonical_content."""

    relationship_id: str
    relationship_type: str
    source_object_id: str
    target_object_id: str
    directionality: str
    target_scope_id: str | None = None
    policy_basis: str | None = None


class AnyEnvelope(_EnvelopeCore, frozen=True, kw_only=True, omit_defaults=True):
    """The envelope of a version that may be an object's or a relationship's: every field of both."""

    object_id: str | None = None
    object_type: str | None = None
    schema_id: str | None = None
    relationship_refs: list[str] | None = None
    quality_signals: QualitySignals | None = None
    relationship_id: str | None = None
    relationship_type: str | None = None
    source_object_id: str | None = None
    target_object_id: str | None = None
    directionality: str | None = None
    target_scope_id: str | None = None
    policy_basis: str | None = None


# --- payloads ---------------------------------------------------------------------------------------------

class _Payload(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """What every payload may carry: the evaluation run that wrote the entry (schemas.evaluation), absent
    outside one (omitted, so entries outside runs keep their bytes)."""

    evaluation_run_id: str | None = None


class Created(_Payload, frozen=True, kw_only=True, omit_defaults=True):
    envelope: ObjectEnvelope
    content_digest: str | None  # always written, null when the version has no content


class Updated(Created, frozen=True, kw_only=True, omit_defaults=True):
    previous_version_id: str


class RelationshipCreated(_Payload, frozen=True, kw_only=True, omit_defaults=True):
    envelope: RelationshipEnvelope
    content_digest: str | None


class RelationshipUpdated(RelationshipCreated, frozen=True, kw_only=True, omit_defaults=True):
    previous_version_id: str


class Transitioned(_Payload, frozen=True, kw_only=True, omit_defaults=True):
    """A state change (and, for deletion and redaction, the erasure it brings) of an object or relationship."""

    envelope: AnyEnvelope
    content_digest: str | None
    dimension: str
    from_: str = msgspec.field(name="from")
    to: str
    previous_version_id: str
    policy_basis: str | None = None
    policy_override: bool | None = None
    redaction: dict[str, Any] | None = None  # a redaction's record: its target, pointers, erase or suppress


class ProvenanceCorrected(_Payload, frozen=True, kw_only=True, omit_defaults=True):
    envelope: AnyEnvelope
    content_digest: str | None
    previous_version_id: str
    previous_provenance_id: str
    removed_fields: list[str] | None = None
    policy_basis: str | None = None


class _IndexAction(_Payload, tag_field="action", frozen=True, kw_only=True, omit_defaults=True):
    """An index_rebuilt entry's payload, told apart by its `action`."""


class SpaceRegistered(_IndexAction, tag="space_registered", frozen=True, kw_only=True, omit_defaults=True):
    embedding_space: EmbeddingSpace
    space_digest: str


class DefaultSpaceSet(_IndexAction, tag="default_space_set", frozen=True, kw_only=True, omit_defaults=True):
    embedding_space_id: str


class RebuildCompleted(_IndexAction, tag="rebuild_completed", frozen=True, kw_only=True, omit_defaults=True):
    embedding_space_id: str
    space_digest: str
    count: int  # vectors written
    objects: int  # current objects looked at
    filled_sequence: int


class ScopeImported(_IndexAction, tag="scope_imported", frozen=True, kw_only=True, omit_defaults=True):
    """The entry an import writes after the last entry it replayed (PAMSPEC's event types are a closed list,
    so it is an operational `index_rebuilt` entry with an action of pamledger's own): which bundle, from
    which ledger and scope, how scopes were remapped, and the bundle's counts (what it replayed among them).
    The replayed entries are the scope's entries before it, back to its first."""

    bundle_digest: str
    source_ledger_id: str
    source_scope_id: str
    watermark: int  # the bundle's export watermark, a sequence of the source ledger
    chunks: int
    scope_map: dict[str, str] | None = None
    counts: dict[str, int] | None = None


class SnapshotSealed(_IndexAction, tag="snapshot_sealed", frozen=True, kw_only=True, omit_defaults=True):
    """The entry that seals an evaluation snapshot (schemas.snapshots): its descriptor, digest included."""

    snapshot: dict[str, Any]  # evaluation-snapshot.schema.json


class EvaluationStarted(_IndexAction, tag="evaluation_started", frozen=True, kw_only=True, omit_defaults=True):
    """The first entry of an evaluation scope (schemas.evaluation): the run, the snapshot it forks, how."""
    snapshot_id: str
    base_scope_id: str
    ledger_sequence_high_watermark: int
    snapshot_digest: str
    deterministic_clock: dict[str, Any] | None = None
    deterministic_rng_seed: int | None = None


class EvaluationEnded(_IndexAction, tag="evaluation_ended", frozen=True, kw_only=True, omit_defaults=True):
    """The last entry of an evaluation run: its scope stays readable, takes no more writes."""
    entries: int  # the scope's entries before this one


class Embedded(_Payload, frozen=True, kw_only=True, omit_defaults=True):
    embedding_space_id: str
    space_digest: str
    count: int
    items: list[tuple[str, str]]  # (object_id, version_id) embedded in the batch
    from_ledger_sequence: int
    through_ledger_sequence: int
    # (object_id, version_id) whose vector an import handed over (same space): stored as they came, not embedded
    reused: list[tuple[str, str]] = []


class Denied(_Payload, frozen=True, kw_only=True, omit_defaults=True):
    """What an access_denied entry says of a refused request (schemas.commands.Denial, defaults left out)."""

    request: str
    rule_id: str
    code: str = "access_denied"
    requested_scope_id: str | None = None
    authenticated: bool = False
    token_id: str | None = None
    claimed_actor_id: str | None = None
    suppressed: int = 0


class Promoted(_Payload, frozen=True, kw_only=True, omit_defaults=True):
    source_object_id: str
    source_version_id: str
    promoted_object_id: str
    promoted_version_id: str
    promoted_object_type: str
    relationship_id: str
    relationship_version_id: str


class ToolRecorded(_Payload, frozen=True, kw_only=True, omit_defaults=True):
    object_id: str
    version_id: str
    invocation_object_id: str | None = None  # tool_completed: the invocation it answers


class SubscriptionOpenedPayload(_Payload, frozen=True, kw_only=True, omit_defaults=True):
    subscription: dict[str, Any]  # the stored subscription (subscription.schema.json)


class SubscriptionClosedPayload(_Payload, frozen=True, kw_only=True, omit_defaults=True):
    subscription_id: str
    reason: str
    last_delivered_sequence: int


class DelegationGrantedPayload(_Payload, frozen=True, kw_only=True, omit_defaults=True):
    delegation: dict[str, Any]  # the Delegation Object (delegation.schema.json)


class DelegationRevokedPayload(_Payload, frozen=True, kw_only=True, omit_defaults=True):
    delegation_id: str
    reason: str


class DelegationExercisedPayload(_Payload, frozen=True, kw_only=True, omit_defaults=True):
    delegation_id: str
    operation: str
    use: int
    object_id: str | None = None
    object_type: str | None = None


# --- events -----------------------------------------------------------------------------------------------

class _Event(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True, tag_field="event_type"):
    """The fields every ledger entry has. `sequence` is the object's version sequence (an event-only
    entry's is its ledger sequence); ledger order is the row's own."""

    event_id: str
    operation_id: str
    scope_id: str
    recorded_at: Timestamp
    sequence: int
    actor: Actor
    object_id: str | None = None  # the object it is about, where it is about one
    relationship_id: str | None = None  # a Relationship Version's event names its relationship instead
    version_id: str | None = None

    @property
    def event_type(self) -> str:
        return str(self.__struct_config__.tag)


class _VersionEvent(_Event, frozen=True, kw_only=True, omit_defaults=True):
    version_id: str  # the version it commits


class ObjectCreated(_VersionEvent, tag="object_created", frozen=True, kw_only=True, omit_defaults=True):
    payload: Created


class ObjectUpdated(_VersionEvent, tag="object_updated", frozen=True, kw_only=True, omit_defaults=True):
    payload: Updated


class LifecycleTransitioned(_VersionEvent, tag="lifecycle_transitioned", frozen=True, kw_only=True,
                            omit_defaults=True):
    payload: Transitioned


class AvailabilityTransitioned(_VersionEvent, tag="availability_transitioned", frozen=True, kw_only=True,
                               omit_defaults=True):
    payload: Transitioned


class RetentionTransitioned(_VersionEvent, tag="retention_transitioned", frozen=True, kw_only=True,
                            omit_defaults=True):
    payload: Transitioned


class ValidationTransitioned(_VersionEvent, tag="validation_transitioned", frozen=True, kw_only=True,
                             omit_defaults=True):
    payload: Transitioned


class ObjectDeleted(_VersionEvent, tag="object_deleted", frozen=True, kw_only=True, omit_defaults=True):
    payload: Transitioned


class ObjectRedacted(_VersionEvent, tag="object_redacted", frozen=True, kw_only=True, omit_defaults=True):
    payload: Transitioned


class ProvenanceUpdated(_VersionEvent, tag="provenance_updated", frozen=True, kw_only=True, omit_defaults=True):
    payload: ProvenanceCorrected


class RelationshipCreatedEvent(_VersionEvent, tag="relationship_created", frozen=True, kw_only=True,
                               omit_defaults=True):
    payload: RelationshipCreated


class RelationshipUpdatedEvent(_VersionEvent, tag="relationship_updated", frozen=True, kw_only=True,
                               omit_defaults=True):
    payload: RelationshipUpdated


class _EntryEvent(_Event, frozen=True, kw_only=True, omit_defaults=True):
    """An event-only entry: no Memory Version (`version_id` stays unset)."""


class IndexRebuilt(_EntryEvent, tag="index_rebuilt", frozen=True, kw_only=True, omit_defaults=True):
    payload: (SpaceRegistered | DefaultSpaceSet | RebuildCompleted | ScopeImported | SnapshotSealed
             | EvaluationStarted | EvaluationEnded)


class EmbeddingGenerated(_EntryEvent, tag="embedding_generated", frozen=True, kw_only=True, omit_defaults=True):
    payload: Embedded


class AccessDenied(_EntryEvent, tag="access_denied", frozen=True, kw_only=True, omit_defaults=True):
    payload: Denied


class WorkingMemoryPromoted(_EntryEvent, tag="working_memory_promoted", frozen=True, kw_only=True,
                            omit_defaults=True):
    payload: Promoted


class ToolInvoked(_EntryEvent, tag="tool_invoked", frozen=True, kw_only=True, omit_defaults=True):
    payload: ToolRecorded


class ToolCompleted(_EntryEvent, tag="tool_completed", frozen=True, kw_only=True, omit_defaults=True):
    payload: ToolRecorded


class SubscriptionOpened(_EntryEvent, tag="subscription_opened", frozen=True, kw_only=True, omit_defaults=True):
    payload: SubscriptionOpenedPayload


class SubscriptionClosed(_EntryEvent, tag="subscription_closed", frozen=True, kw_only=True, omit_defaults=True):
    payload: SubscriptionClosedPayload


class DelegationGranted(_EntryEvent, tag="delegation_granted", frozen=True, kw_only=True, omit_defaults=True):
    payload: DelegationGrantedPayload


class DelegationRevoked(_EntryEvent, tag="delegation_revoked", frozen=True, kw_only=True, omit_defaults=True):
    payload: DelegationRevokedPayload


class DelegationExercised(_EntryEvent, tag="delegation_exercised", frozen=True, kw_only=True, omit_defaults=True):
    payload: DelegationExercisedPayload


Event = (ObjectCreated | ObjectUpdated | LifecycleTransitioned | AvailabilityTransitioned | RetentionTransitioned
         | ValidationTransitioned | ObjectDeleted | ObjectRedacted | ProvenanceUpdated | RelationshipCreatedEvent
         | RelationshipUpdatedEvent | IndexRebuilt | EmbeddingGenerated | AccessDenied | WorkingMemoryPromoted
         | ToolInvoked | ToolCompleted | SubscriptionOpened | SubscriptionClosed | DelegationGranted
         | DelegationRevoked | DelegationExercised)
EVENT_TYPES: dict[str, type[Any]] = {cls.__struct_config__.tag: cls for cls in Event.__args__}
# What each event type's payload is: the writer converts the payload it built into it.
PAYLOAD_TYPES: dict[str, Any] = {tag: next(f.type for f in msgspec.structs.fields(cls) if f.name == "payload")
                                 for tag, cls in EVENT_TYPES.items()}
decode_event = msgspec.json.Decoder(Event).decode


def event_of(event_type: str, payload: dict[str, Any], **fields: Any) -> Any:
    """The typed event of `event_type` with these fields and `payload`, a dict the writer built, checked and
    converted into the type's payload: the writer cannot write an event its type does not describe. A
    payload that does not fit (only an indexer's record_index_event carries one it did not build) is
    `invalid_request`, naming the field."""
    try:
        typed = msgspec.convert(payload, PAYLOAD_TYPES[event_type])
    except msgspec.ValidationError as exc:
        raise InvalidRequest(f"the {event_type} entry's payload does not match its type: {exc}",
                             details={"event_type": event_type}) from None
    return EVENT_TYPES[event_type](payload=typed, **fields)
