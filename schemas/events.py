"""Ledger events: facts in the past tense, shaped like memory-event.schema.json.

Events never reject unknown fields: old readers must read new data. A ledger row's bytes are the
canonical JSON of one LedgerEvent; they carry content digests, never content, so erasure never has to
touch the ledger.
"""

from __future__ import annotations

from typing import Any, Literal

import msgspec

from schemas.common import Timestamp
from schemas.envelope import Actor

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


class LedgerEvent(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """One Event Ledger entry. `sequence` is the object's version sequence (ledger order is separate)."""

    event_id: str
    operation_id: str
    scope_id: str
    event_type: EventType
    recorded_at: Timestamp
    sequence: int
    actor: Actor
    object_id: str | None = None
    version_id: str | None = None
    relationship_id: str | None = None
    payload: dict[str, Any] = msgspec.field(default_factory=dict)


event_decoder = msgspec.json.Decoder(dict[str, Any])
