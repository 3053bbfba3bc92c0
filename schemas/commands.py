"""Commands: imperatives sent to the writer. They reject unknown fields.

Each command has its own NATS subject and its own decoder, built once. The idempotency key may travel in
the payload or in the `Pam-Idempotency-Key` header (the header wins when both are present and equal;
differing values are invalid_request).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

import msgspec

from schemas.common import (
    COMMAND_STRUCT,
    AvailabilityState,
    Dimension,
    Id,
    IdempotencyKey,
    LifecycleState,
    ObjectType,
    RetentionState,
    Text,
    Timestamp,
    ValidationState,
)
from schemas.delegation import CheckDelegation, DelegationCommand, GrantDelegation, RevokeDelegation
from schemas.embedding import FLOAT4_MAX, MAX_DIMENSIONS, EmbeddingSpace
from schemas.envelope import Actor, Integrity, Provenance, QualitySignals
from schemas.redaction import Redact
from schemas.relationship import Relate
from schemas.snapshots import CreateSnapshot
from schemas.evaluation import EndEvaluation, StartEvaluation

# `\Z`, not `$`: `$` also matches before a final newline (see schemas.common.ID_PATTERN).
SchemaUri = Annotated[str, msgspec.Meta(pattern=r"^[A-Za-z][A-Za-z0-9+.-]*:[^\s\x00]+\Z", max_length=1024)]
StateName = Annotated[str, msgspec.Meta(min_length=1, max_length=64)]



class CreateObject(msgspec.Struct, tag="create", **COMMAND_STRUCT):
    """Create a new Memory Object (section 10.1)."""

    scope_id: Id
    object_type: ObjectType
    canonical_content: Any
    actor: Actor
    provenance: Provenance
    object_id: Id | None = None
    schema_id: SchemaUri | None = None
    lifecycle_state: LifecycleState | None = None
    availability_state: AvailabilityState = "available"
    retention_state: RetentionState = "retained"
    validation_state: ValidationState = "unverified"
    observed_at: Timestamp | None = None
    asserted_at: Timestamp | None = None
    valid_from: Timestamp | None = None
    valid_until: Timestamp | None = None
    relationship_refs: list[Id] | None = None
    integrity: Integrity | None = None
    quality_signals: QualitySignals | None = None
    idempotency_key: IdempotencyKey | None = None
    operation_id: Id | None = None


class UpdateObject(msgspec.Struct, tag="update", **COMMAND_STRUCT):
    """Write new canonical content as a new version (section 10.3)."""

    scope_id: Id
    object_id: Id
    expected_version_id: Id
    canonical_content: Any
    actor: Actor
    provenance: Provenance
    observed_at: Timestamp | None = None
    asserted_at: Timestamp | None = None
    valid_from: Timestamp | None = None
    valid_until: Timestamp | None = None
    relationship_refs: list[Id] | None = None
    integrity: Integrity | None = None
    quality_signals: QualitySignals | None = None
    idempotency_key: IdempotencyKey | None = None
    operation_id: Id | None = None


class TransitionState(msgspec.Struct, tag="transition", **COMMAND_STRUCT):
    """Move one state dimension to a target state (section 10.4, tables of 9.5)."""

    scope_id: Id
    object_id: Id
    expected_version_id: Id
    dimension: Dimension
    target_state: StateName
    actor: Actor
    provenance: Provenance
    policy_basis: Text | None = None
    # Moves the 9.5 tables list under "forbidden without policy override" (scratch -> active, ...): allowed only
    # with this set, a policy_basis, and (auth enforced) an administrator as actor.
    policy_override: bool = False
    idempotency_key: IdempotencyKey | None = None
    operation_id: Id | None = None


class DeleteObject(msgspec.Struct, tag="delete", **COMMAND_STRUCT):
    """Write the final tombstone version and erase the object's content (section 10.11)."""

    scope_id: Id
    object_id: Id
    expected_version_id: Id
    actor: Actor
    provenance: Provenance
    policy_basis: Text | None = None
    idempotency_key: IdempotencyKey | None = None
    operation_id: Id | None = None


class Promote(msgspec.Struct, tag="promote", **COMMAND_STRUCT):
    """Consolidate a working_memory object into a canonical Memory Object (section 10.10), atomically: the new
    object (provenance.transformation_parent = the source's version), the source moved to `superseded`, a
    `derived_from` Relationship Object from the new object to the source, and a `working_memory_promoted` entry."""

    scope_id: Id
    source_object_id: Id
    expected_version_id: Id
    target_object_type: ObjectType
    target_canonical_content: Any
    actor: Actor
    provenance: Provenance
    target_object_id: Id | None = None
    target_schema_id: SchemaUri | None = None
    target_lifecycle_state: LifecycleState | None = None
    target_validation_state: ValidationState = "unverified"
    relationship_id: Id | None = None
    quality_signals: QualitySignals | None = None
    idempotency_key: IdempotencyKey | None = None
    operation_id: Id | None = None


class CorrectProvenance(msgspec.Struct, tag="correct_provenance", **COMMAND_STRUCT):
    """Write a new version whose provenance is `provenance` (section 8.6), with a `provenance_updated` entry.

    Provenance is never silently removed: every field the current provenance has and the correction lacks must
    be named in `removed_fields` (else invalid_request), and the entry records the previous provenance_id."""

    scope_id: Id
    object_id: Id
    expected_version_id: Id
    actor: Actor
    provenance: Provenance
    removed_fields: list[Annotated[str, msgspec.Meta(min_length=1, max_length=64)]] | None = None
    policy_basis: Text | None = None
    idempotency_key: IdempotencyKey | None = None
    operation_id: Id | None = None


class CreateScope(msgspec.Struct, tag="create_scope", **COMMAND_STRUCT):
    """Register a Memory Scope (memory-scope.schema.json); creating an existing scope is a no-op."""

    scope_id: Id
    scope_kind: Annotated[str, msgspec.Meta(min_length=1, max_length=128)]
    parent_scope_id: Id | None = None
    policy: dict[str, Any] | None = None


class OpenSubscription(msgspec.Struct, tag="open_subscription", **COMMAND_STRUCT):
    """Gateway → writer: record subscription_opened (an event-only ledger entry, no Memory Version)."""

    scope_id: Id
    subscription_id: Id
    actor: Actor
    subscription: dict[str, Any]
    operation_id: Id | None = None
    idempotency_key: IdempotencyKey | None = None


class CloseSubscription(msgspec.Struct, tag="close_subscription", **COMMAND_STRUCT):
    """Gateway → writer: record subscription_closed with the reason and the last delivered sequence."""

    scope_id: Id
    subscription_id: Id
    actor: Actor
    reason: Annotated[str, msgspec.Meta(max_length=256)]
    last_delivered_sequence: Annotated[int, msgspec.Meta(ge=0)]
    operation_id: Id | None = None
    idempotency_key: IdempotencyKey | None = None


class RegisterEmbeddingSpace(msgspec.Struct, tag="register_embedding_space", **COMMAND_STRUCT):
    """Record an Embedding Space (an `index_rebuilt` entry, action `space_registered`, in the system scope).

    Its idempotency key is always `embedding-space:<id>` and "the same request" means the same descriptor:
    registering the same descriptor again replays the first registration, and another descriptor under a
    registered id is refused (`invalid_request`), whoever sends it."""

    scope_id: Id
    space: EmbeddingSpace
    actor: Actor
    operation_id: Id | None = None


IndexEventType = Literal["embedding_generated", "index_rebuilt"]


class RecordIndexEvent(msgspec.Struct, tag="record_index_event", **COMMAND_STRUCT):
    """Indexer → writer: an event-only `embedding_generated` / `index_rebuilt` entry (no Memory Version)."""

    scope_id: Id
    event_type: IndexEventType
    actor: Actor
    payload: dict[str, Any]
    operation_id: Id | None = None
    idempotency_key: IdempotencyKey | None = None


class Denial(msgspec.Struct, **COMMAND_STRUCT):
    """What an `access_denied` entry says about a refused request: never its content."""

    request: Annotated[str, msgspec.Meta(max_length=64)]  # the request kind, e.g. "query.read"
    rule_id: Annotated[str, msgspec.Meta(max_length=128)]
    code: Literal["access_denied", "policy_denied"] = "access_denied"
    requested_scope_id: Id | None = None
    authenticated: bool = False
    token_id: Annotated[str, msgspec.Meta(max_length=64)] | None = None
    claimed_actor_id: Id | None = None
    suppressed: Annotated[int, msgspec.Meta(ge=0)] = 0  # denials of this caller and rule not recorded since the last


class RecordAccessDenied(msgspec.Struct, tag="record_access_denied", **COMMAND_STRUCT):
    """Service → writer: an event-only `access_denied` entry in the system scope (the denied caller is the
    entry's actor when it authenticated, else `actor:anonymous`)."""

    scope_id: Id
    actor: Actor
    denial: Denial
    operation_id: Id | None = None
    idempotency_key: IdempotencyKey | None = None


class ImportedVector(msgspec.Struct, **COMMAND_STRUCT):
    """A vector a bundle carries for its entry's version (schemas.bundle.VectorLine, `export --vectors`): the
    writer hands it to the indexer when this service registered the same space (same id and descriptor
    digest), else leaves it out and the indexer embeds the content as for any version."""

    embedding_space_id: Id
    space_digest: Annotated[str, msgspec.Meta(pattern=r"^sha256:[0-9a-f]{64}\Z")]
    vector: Annotated[list[Annotated[float, msgspec.Meta(ge=-FLOAT4_MAX, le=FLOAT4_MAX)]],
                      msgspec.Meta(min_length=1, max_length=MAX_DIMENSIONS)]


class ImportedEntry(msgspec.Struct, **COMMAND_STRUCT):
    """One ledger entry of a bundle, as an import replays it: the entry's event (its source bytes, with scope
    ids remapped) and, for a version, its envelope as the bundle has it (content null where erased or
    hidden) with the salt of the content's digest (hex) where the bundle carries the content. The writer
    checks the event against its type, the envelope against the event, and the content against the digest."""

    event: dict[str, Any]
    envelope: dict[str, Any] | None = None
    salt: Annotated[str, msgspec.Meta(pattern=r"^(?:[0-9a-f]{2}){1,64}\Z")] | None = None
    vectors: Annotated[list[ImportedVector], msgspec.Meta(max_length=64)] | None = None  # of a shown version


class ImportEntries(msgspec.Struct, tag="import_entries", **COMMAND_STRUCT):
    """One chunk of a bundle's import into a new or empty scope (`pamledger import`, an administrator's).

    Chunk 0 needs the scope to hold no ledger entry (and creates it from `scope_kind` etc. when it is new);
    chunk k needs chunk k-1 of the same bundle committed. Its idempotency key is always
    `import:<bundle_digest>:<chunk>` (schemas.bundle.chunk_key), so a re-run replays what committed and goes
    on from there. The last chunk (`final`) also writes the entry that records the import."""

    scope_id: Id
    actor: Actor
    bundle_digest: Annotated[str, msgspec.Meta(pattern=r"^sha256:[0-9a-f]{64}\Z")]
    source_ledger_id: Id
    source_scope_id: Id
    chunk: Annotated[int, msgspec.Meta(ge=0, le=10_000_000)]
    entries: Annotated[list[ImportedEntry], msgspec.Meta(max_length=2000)]
    final: bool = False
    scope_kind: Annotated[str, msgspec.Meta(min_length=1, max_length=128)] = "workspace"
    parent_scope_id: Id | None = None
    policy: dict[str, Any] | None = None
    scope_map: dict[Id, Id] | None = None  # source scope -> scope here, as the import remapped them
    watermark: Annotated[int, msgspec.Meta(ge=0)] = 0  # the bundle's export watermark (its source ledger's)
    counts: dict[Annotated[str, msgspec.Meta(max_length=64)], Annotated[int, msgspec.Meta(ge=0)]] | None = None
    operation_id: Id | None = None
    idempotency_key: IdempotencyKey | None = None


ObjectCommand = CreateObject | UpdateObject | TransitionState | DeleteObject | Relate | Redact | Promote | CorrectProvenance
EventOnlyCommand = OpenSubscription | CloseSubscription | RegisterEmbeddingSpace | RecordIndexEvent | RecordAccessDenied
Command = (ObjectCommand | EventOnlyCommand | CreateScope | DelegationCommand | ImportEntries | CreateSnapshot
           | StartEvaluation | EndEvaluation)

COMMAND_TYPES: dict[str, type[Command]] = {
    "create": CreateObject,
    "update": UpdateObject,
    "transition": TransitionState,
    "delete": DeleteObject,
    "relate": Relate,
    "redact": Redact,
    "promote": Promote,
    "correct_provenance": CorrectProvenance,
    "create_scope": CreateScope,
    "open_subscription": OpenSubscription,
    "close_subscription": CloseSubscription,
    "register_embedding_space": RegisterEmbeddingSpace,
    "record_index_event": RecordIndexEvent,
    "record_access_denied": RecordAccessDenied,
    "grant_delegation": GrantDelegation,
    "check_delegation": CheckDelegation,
    "revoke_delegation": RevokeDelegation,
    "import_entries": ImportEntries,
    "snapshot_create": CreateSnapshot,
    "eval_start": StartEvaluation,
    "eval_end": EndEvaluation,
}

DECODERS: dict[str, msgspec.json.Decoder[Any]] = {
    name: msgspec.json.Decoder(cls) for name, cls in COMMAND_TYPES.items()
}
