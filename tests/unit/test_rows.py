"""The pure projection: an event's bytes -> its current_objects row."""

from __future__ import annotations

from projector.rows import COLUMNS, current_row
from schemas.canonical import canonical_bytes, decode_json

META = {
    "scope_id": "workspace:rows", "object_id": "mem:1", "version_id": "ver:1", "sequence": 2,
    "object_type": "claim", "lifecycle_state": "active", "availability_state": "available",
    "retention_state": "retained", "validation_state": "corroborated",
    "actor": {"actor_id": "actor:agent:x", "actor_kind": "agent"},
    "provenance": {"provenance_id": "prov:1", "activity": "naïve — ünïcode ✓", "weight": 0.1},
    "committed_at": "2026-11-29T20:00:00.000001Z", "recorded_at": "2026-11-29T20:00:00.000002Z",
    "valid_from": "2026-01-01T00:00:00Z", "quality": {"confidence": 0.30000000000000004, "tags": ["b", "a"]},
}


def event(meta: object, object_id: object = "mem:1") -> bytes:
    return canonical_bytes({"event_type": "object_updated", "object_id": object_id, "scope_id": "workspace:rows",
                            "payload": {"envelope": meta, "content_digest": "sha256:ab"}})


def test_the_row_carries_every_authoritative_field_and_the_canonical_envelope_bytes() -> None:
    row = current_row(event(META), 42)
    assert row is not None and len(row) == len(COLUMNS)
    values = dict(zip(COLUMNS, row))
    assert values["ledger_sequence"] == 42 and values["sequence"] == 2
    assert values["actor_id"] == "actor:agent:x" and values["provenance_id"] == "prov:1"
    assert values["valid_from"] == "2026-01-01T00:00:00Z" and values["observed_at"] is None
    assert values["schema_id"] is None and values["content_digest"] == "sha256:ab"
    # meta is the envelope's own slice of the event: byte-identical to encoding the envelope afresh
    assert values["meta"] == canonical_bytes(decode_json(canonical_bytes(META)))


def test_events_without_a_version_leave_no_row() -> None:
    assert current_row(event(None), 1) is None
    assert current_row(event(META, object_id=None), 1) is None
    assert current_row(canonical_bytes({"event_type": "subscription_opened", "payload": {}}), 1) is None
