"""Relationship Objects (PAMSPEC 8.5, 10.5): the Relate command, the relationship-type vocabulary and the
rules on a relationship's endpoints. Pure: no I/O.

A Relationship Object is versioned like a Memory Object and lives beside them in the ledger and in
memory_versions (its relationship_id names it in its scope; object and relationship ids share one namespace
per scope). Its envelope follows relationship.schema.json: relationship_id, relationship_type,
source_object_id, target_object_id (target_scope_id when the target lives in another scope), directionality,
canonical_content, the four state dimensions, actor, provenance, policy_basis, temporal fields, integrity.
"""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal

import msgspec

from schemas.common import (
    COMMAND_STRUCT,
    EXTENSION_TYPE_PATTERNS,
    AvailabilityState,
    Id,
    IdempotencyKey,
    LifecycleState,
    RetentionState,
    Text,
    Timestamp,
    ValidationState,
)
from schemas.envelope import Actor, Integrity, Provenance
from pamledger_client.protocol.vocabulary import (
    DIRECTIONALITIES as DIRECTIONALITIES,
    RELATIONSHIP_VOCABULARY as RELATIONSHIP_VOCABULARY,
    Directionality as Directionality,
)

DERIVED_FROM = "derived_from"
INITIAL_STATES = {"lifecycle": "active", "availability": "available", "retention": "retained",
                  "validation": "unverified"}
_SHORT_LABEL = re.compile(r"^[a-z][a-z0-9_]{0,63}\Z")
RelationshipType = Annotated[str, msgspec.Meta(min_length=1, max_length=256, pattern=r"^[^\s\x00]+\Z")]



class Relate(msgspec.Struct, tag="relate", **COMMAND_STRUCT):
    """Create a Relationship Object, or (with relationship_id and expected_version_id) write its next version.

    Source and target are fixed at creation: an update that names other endpoints is relationship_conflict.
    States move afterwards with `transition` on the relationship_id, like any object's."""

    scope_id: Id
    source_object_id: Id
    target_object_id: Id
    relationship_type: RelationshipType
    directionality: Directionality
    actor: Actor
    provenance: Provenance
    relationship_id: Id | None = None
    expected_version_id: Id | None = None
    target_scope_id: Id | None = None  # the target's scope when it is not scope_id: needs policy_basis
    canonical_content: Any = msgspec.field(default_factory=dict)
    policy_basis: Text | None = None
    # States at creation (defaults: active, available, retained, unverified). An update that names a state
    # other than the relationship's current one is invalid_request: states move with `transition`.
    lifecycle_state: LifecycleState | None = None
    availability_state: AvailabilityState | None = None
    retention_state: RetentionState | None = None
    validation_state: ValidationState | None = None
    observed_at: Timestamp | None = None
    asserted_at: Timestamp | None = None
    valid_from: Timestamp | None = None
    valid_until: Timestamp | None = None
    integrity: Integrity | None = None
    idempotency_key: IdempotencyKey | None = None
    operation_id: Id | None = None


def relationship_type_problem(relationship_type: str) -> str | None:
    """Why a relationship_type is not accepted (None: it is): a short label must be one of the vocabulary
    (a typo would otherwise become a new type nobody queries for); reverse-DNS and URI names are kept."""
    if relationship_type in RELATIONSHIP_VOCABULARY:
        return None
    if any(p.match(relationship_type) for p in EXTENSION_TYPE_PATTERNS):
        return None
    if _SHORT_LABEL.match(relationship_type):
        return "unknown short relationship_type: use one of the vocabulary or a reverse-DNS or URI name"
    return "relationship_type is neither a short label of the vocabulary nor a reverse-DNS or URI name"


def self_loop_allowed(relationship_type: str) -> bool:
    """True when an object may relate to itself by this type (extension types: the agent's call)."""
    return RELATIONSHIP_VOCABULARY.get(relationship_type, True)


def is_relationship(meta: dict[str, Any]) -> bool:
    """True for a Relationship Version's envelope metadata (a Memory Version's has an object_type)."""
    return "relationship_id" in meta
