"""The canonical Memory Version envelope (PAMSPEC section 8.1) and the structs inside it.

Nested structs mirror JSON Schemas with `additionalProperties: false`, so they reject unknown fields;
`omit_defaults` keeps unset optional fields out of the bytes (the schemas forbid nulls there).
"""

from __future__ import annotations

from typing import Annotated, Any

import msgspec

from schemas.common import (
    AvailabilityState,
    Id,
    LifecycleState,
    RetentionState,
    Text,
    Timestamp,
    Unit,
    ValidationState,
)

_STRICT: dict[str, bool] = dict(frozen=True, kw_only=True, omit_defaults=True, forbid_unknown_fields=True)


class Attestation(msgspec.Struct, **_STRICT):
    """Optional, non-authoritative identity attestation of an actor."""

    agent_manifest_ref: Text | None = None
    manifest_digest: Text | None = None
    manifest_digest_algorithm: Text | None = None
    attestation_authority: Text | None = None
    attestation_method: Text | None = None
    signature: Text | None = None
    signature_algorithm: Text | None = None
    issued_at: Timestamp | None = None
    not_before: Timestamp | None = None
    not_after: Timestamp | None = None
    capabilities_declared: list[Text] | None = None
    did_ref: Text | None = None


class Actor(msgspec.Struct, **_STRICT):
    """Who performed an operation, and for whom."""

    actor_id: Id
    actor_kind: Annotated[str, msgspec.Meta(min_length=1, max_length=128)]
    display_name: Text | None = None
    on_behalf_of_actor_id: Id | None = None
    delegation_id: Id | None = None
    attestation: Attestation | None = None


class Provenance(msgspec.Struct, **_STRICT):
    """Machine-readable origin of a version (section 8.6)."""

    provenance_id: Id
    actor: Actor
    activity: Annotated[str, msgspec.Meta(min_length=1, max_length=256)]
    recorded_at: Timestamp | None = None
    source_ref: Text | None = None
    evidence_refs: list[Text] | None = None
    observed_at: Timestamp | None = None
    transformation_parent: Text | None = None
    source_confidence: Unit | None = None
    integrity_ref: Text | None = None


class Integrity(msgspec.Struct, **_STRICT):
    """Digests and signatures bound to a version."""

    digest: Annotated[str, msgspec.Meta(min_length=1)] | None = None
    algorithm: Annotated[str, msgspec.Meta(min_length=1)] | None = None
    canonicalization_profile: Annotated[str, msgspec.Meta(min_length=1)] | None = None
    signature: Text | None = None
    ledger_ref: Text | None = None


class QualitySignals(msgspec.Struct, **_STRICT):
    """Non-authoritative quality signals; never override validation_state."""

    assessed_confidence: Unit | None = None
    contradiction_score: Unit | None = None
    staleness_score: Unit | None = None
    evidence_strength: Unit | None = None
    source_diversity: Unit | None = None
    last_verified_at: Timestamp | None = None
    last_verified_by_actor_id: Id | None = None
    verification_method_id: Text | None = None
    assessed_at: Timestamp | None = None
    assessed_by_actor_id: Id | None = None


class MemoryVersion(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """One immutable logical Memory Version: every section 8.1 field, optional ones included."""

    spec_version: str
    object_id: str
    version_id: str
    scope_id: str
    object_type: str
    canonical_content: Any
    lifecycle_state: LifecycleState
    availability_state: AvailabilityState
    retention_state: RetentionState
    validation_state: ValidationState
    committed_at: Timestamp
    recorded_at: Timestamp
    sequence: int
    actor: Actor
    provenance: Provenance
    schema_id: str | None = None
    observed_at: Timestamp | None = None
    asserted_at: Timestamp | None = None
    valid_from: Timestamp | None = None
    valid_until: Timestamp | None = None
    relationship_refs: list[str] | None = None
    integrity: Integrity | None = None
    quality_signals: QualitySignals | None = None
