"""The parts of ledger events each follower reads: partial views of schemas.events, declared once here.

Why views: a follower decodes only what it uses (the projector's row fields, the indexer's version and
registry fields), which is faster than the whole event and keeps old readers reading new data: a view
ignores fields it does not know. Each view is a field subset of the full types (by name, recursively;
tests/unit/test_event_views.py), so a view can never name a field no event has.
"""

from __future__ import annotations

from typing import Any

import msgspec


# --- the projector: a version's row (projector.rows) ------------------------------------------------------

class ActorRef(msgspec.Struct):
    actor_id: str


class ProvenanceRef(msgspec.Struct):
    provenance_id: str


class ProjectedObject(msgspec.Struct):
    """The object envelope fields a current_objects row needs (the rest stay in `meta`, untouched)."""

    scope_id: str
    object_id: str
    version_id: str
    sequence: int
    object_type: str
    lifecycle_state: str
    availability_state: str
    retention_state: str
    validation_state: str
    actor: ActorRef
    provenance: ProvenanceRef
    committed_at: str
    recorded_at: str
    schema_id: str | None = None
    observed_at: str | None = None
    asserted_at: str | None = None
    valid_from: str | None = None
    valid_until: str | None = None


class ProjectedRelationship(msgspec.Struct):
    """The Relationship envelope fields a current_relationships row needs."""

    scope_id: str
    relationship_id: str
    version_id: str
    sequence: int
    relationship_type: str
    source_object_id: str
    target_object_id: str
    directionality: str
    lifecycle_state: str
    availability_state: str
    retention_state: str
    validation_state: str
    actor: ActorRef
    committed_at: str
    target_scope_id: str | None = None


class ProjectedPayload(msgspec.Struct):
    # The envelope's bytes as they stand (stored as the row's `meta`), decoded again as ProjectedObject or
    # ProjectedRelationship once the event says which. Raw takes no union, hence the JSON null default.
    envelope: msgspec.Raw = msgspec.field(default_factory=lambda: msgspec.Raw(b"null"))
    content_digest: str | None = None


class ProjectedEvent(msgspec.Struct):
    object_id: str | None = None
    relationship_id: str | None = None
    payload: ProjectedPayload | None = None


# --- the indexer: versions to embed, erasures, the space registry (indexer.plan) -------------------------

class IndexedVersion(msgspec.Struct):
    version_id: str
    sequence: int
    object_type: str | None = None  # a Relationship Version's envelope has none: it is not embedded
    availability_state: str = "active"


class IndexedPayload(msgspec.Struct):
    envelope: IndexedVersion | None = None
    content_digest: str | None = None
    action: str | None = None
    embedding_space: Any = None  # decoded by schemas.embedding.decode_space where it is used
    embedding_space_id: str | None = None
    space_digest: str | None = None


class IndexedEvent(msgspec.Struct):
    event_type: str
    scope_id: str
    object_id: str | None = None
    payload: IndexedPayload | None = None


# --- the Subscribe gateway: the event as JSON ---------------------------------------------------------------
# A subscription's filter predicates name any field by its path (`envelope.lifecycle_state`, `payload.x`), so
# the gateway's view is the whole event as plain JSON values (subscriptions.filters reads it).
event_as_json = msgspec.json.Decoder(dict[str, Any]).decode
