"""Pure projection: a ledger event → the current_objects row it leaves behind.

Every object event carries the full envelope metadata of the version it committed, so an object's row is
a function of its latest event alone; applying events in ledger order and keeping the last row per
object gives the same table however the events are batched (that is what makes replay byte-identical).
The full-text vector is derived in SQL from the content store, never from the event (events carry no
content).
"""

from __future__ import annotations

from typing import Any

from schemas.canonical import canonical_bytes

COLUMNS = (
    "scope_id", "object_id", "version_id", "sequence", "ledger_sequence", "object_type", "schema_id",
    "lifecycle_state", "availability_state", "retention_state", "validation_state", "actor_id",
    "provenance_id", "observed_at", "asserted_at", "valid_from", "valid_until", "committed_at",
    "recorded_at", "content_digest", "meta",
)

Row = tuple[Any, ...]


def current_row(event: dict[str, Any], ledger_sequence: int) -> Row | None:
    """The row an event leaves for its object, or None when the event does not touch a version."""
    payload = event.get("payload") or {}
    meta = payload.get("envelope")
    if not isinstance(meta, dict) or event.get("object_id") is None:
        return None
    return (
        meta["scope_id"], meta["object_id"], meta["version_id"], meta["sequence"], ledger_sequence,
        meta["object_type"], meta.get("schema_id"),
        meta["lifecycle_state"], meta["availability_state"], meta["retention_state"], meta["validation_state"],
        meta["actor"]["actor_id"], meta["provenance"]["provenance_id"],
        meta.get("observed_at"), meta.get("asserted_at"), meta.get("valid_from"), meta.get("valid_until"),
        meta["committed_at"], meta["recorded_at"], payload.get("content_digest"), canonical_bytes(meta),
    )


def fold(rows: dict[tuple[str, str], Row], row: Row | None) -> None:
    """Keep the latest row per (scope_id, object_id); rows arrive in ledger order."""
    if row is not None:
        rows[(row[0], row[1])] = row
