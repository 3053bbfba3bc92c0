"""Pure projection: a ledger event → the current_objects (or current_relationships) row it leaves behind.

Every object event (and every Relationship Version's, which names relationship_id instead) carries the
full envelope metadata of the version it committed, so an object's row is a function of its latest event alone; applying events in ledger order and keeping the last row per
object gives the same table however the events are batched (that is what makes replay byte-identical).
The full-text vector is derived in SQL from the content store, never from the event (events carry no
content).
"""

from __future__ import annotations

from collections.abc import Container
from typing import Any, NamedTuple

import msgspec

from schemas.event_views import ProjectedEvent, ProjectedObject, ProjectedRelationship

COLUMNS = (
    "scope_id", "object_id", "version_id", "sequence", "ledger_sequence", "object_type", "schema_id",
    "lifecycle_state", "availability_state", "retention_state", "validation_state", "actor_id",
    "provenance_id", "observed_at", "asserted_at", "valid_from", "valid_until", "committed_at",
    "recorded_at", "content_digest", "meta",
)

Row = tuple[Any, ...]


_decode_event = msgspec.json.Decoder(ProjectedEvent).decode
_decode_meta = msgspec.json.Decoder(ProjectedObject).decode


def current_row(event: bytes, ledger_sequence: int) -> Row | None:
    """The row an event (its canonical JSON bytes) leaves for its object, or None when the event does not
    touch a version. `meta` is the envelope's bytes as they stand in the event: a member of canonical JSON
    is itself canonical, so no re-encoding is needed."""
    found = project(event, ledger_sequence)
    return found.row if found is not None and not found.relationship else None


def _object_row(raw: bytes, content_digest: str | None, ledger_sequence: int) -> Row:
    m = _decode_meta(raw)
    return (
        m.scope_id, m.object_id, m.version_id, m.sequence, ledger_sequence, m.object_type, m.schema_id,
        m.lifecycle_state, m.availability_state, m.retention_state, m.validation_state,
        m.actor.actor_id, m.provenance.provenance_id,
        m.observed_at, m.asserted_at, m.valid_from, m.valid_until,
        m.committed_at, m.recorded_at, content_digest, raw,
    )


def fold(rows: dict[tuple[str, str], Row], row: Row | None) -> None:
    """Keep the latest row per (scope_id, object_id); rows arrive in ledger order."""
    if row is not None:
        rows[(row[0], row[1])] = row


def newest_projection(seen: Container[tuple[str, str]], scope_id: str, object_id: str | None, event: bytes,
                      ledger_sequence: int) -> Projected | None:
    """For events read in DESCENDING ledger order with their ledger row's scope_id and object_id column (a
    relationship's id for a Relationship Version): the row this event leaves if it is the first (so the
    latest) to leave one for its object or relationship, else None. An id already in `seen` is skipped
    without decoding its event, so an update-heavy ledger decodes about one event per object, and each row
    is final the moment it is found (a rebuild can stream it out). Objects and relationships share one id
    namespace per scope, so one `seen` serves both."""
    if object_id is None or (scope_id, object_id) in seen:
        return None
    found = project(event, ledger_sequence)
    if found is not None and (found.row[0] != scope_id or found.row[1] != object_id):
        raise ValueError(f"ledger row {ledger_sequence} is filed under ({scope_id}, {object_id}) but its event"
                         f" names ({found.row[0]}, {found.row[1]})")
    return found


# current_relationships (infra/sql/010_relationships.sql): a Relationship Version's row.
RELATIONSHIP_COLUMNS = (
    "scope_id", "relationship_id", "version_id", "sequence", "ledger_sequence", "relationship_type",
    "source_object_id", "target_scope_id", "target_object_id", "directionality", "lifecycle_state",
    "availability_state", "retention_state", "validation_state", "actor_id", "committed_at", "content_digest",
    "meta",
)


_decode_relationship_meta = msgspec.json.Decoder(ProjectedRelationship).decode


class Projected(NamedTuple):
    """One event's row and the table it goes to (current_relationships when `relationship`)."""

    relationship: bool
    row: Row


def project(event: bytes, ledger_sequence: int) -> Projected | None:
    """The row an event leaves: an object's (current_objects), a relationship's (current_relationships),
    or None when it commits no version (event-only entries). `meta` is the envelope's bytes as they stand
    in the event: a member of canonical JSON is itself canonical, so no re-encoding is needed."""
    decoded = _decode_event(event)
    if decoded.payload is None or (decoded.object_id is None and decoded.relationship_id is None):
        return None
    raw = bytes(decoded.payload.envelope)
    if raw == b"null":
        return None
    digest = decoded.payload.content_digest
    if decoded.object_id is not None:
        return Projected(False, _object_row(raw, digest, ledger_sequence))
    return Projected(True, _relationship_row(raw, digest, ledger_sequence))


def relationship_row(event: bytes, ledger_sequence: int) -> Row | None:
    """The current_relationships row a Relationship Version's event leaves, or None for any other event."""
    found = project(event, ledger_sequence)
    return found.row if found is not None and found.relationship else None


def _relationship_row(raw: bytes, content_digest: str | None, ledger_sequence: int) -> Row:
    m = _decode_relationship_meta(raw)
    return (
        m.scope_id, m.relationship_id, m.version_id, m.sequence, ledger_sequence, m.relationship_type,
        m.source_object_id, m.target_scope_id or m.scope_id, m.target_object_id, m.directionality,
        m.lifecycle_state, m.availability_state, m.retention_state, m.validation_state, m.actor.actor_id,
        m.committed_at, content_digest, raw,
    )
