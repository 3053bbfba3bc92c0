"""The pure projection: an event's bytes -> its current_objects row."""

from __future__ import annotations

import pytest

from projector.rows import COLUMNS, Row, current_row, fold, newest_projection
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


def test_newest_first_folding_gives_the_same_rows_as_folding_in_ledger_order() -> None:
    """Replay reads newest first and keeps each object's first row; the live projector folds oldest
    first and keeps the last. Both must leave the same table, whatever mix of events."""
    events: list[tuple[int, str, str | None, bytes]] = []
    for sequence in range(1, 61):
        object_id = f"mem:{sequence % 7}"
        meta = {**META, "object_id": object_id, "sequence": sequence, "version_id": f"ver:{sequence}"}
        payload: object = None if sequence % 5 == 0 else meta  # some object events carry no version
        events.append((sequence, "workspace:rows", object_id, event(payload, object_id=object_id)))
    events.append((61, "workspace:rows", None, canonical_bytes({"event_type": "scope_created", "payload": {}})))
    oldest_first: dict[tuple[str, str], Row] = {}
    for sequence, _, _, data in events:
        fold(oldest_first, current_row(data, sequence))
    newest_first: dict[tuple[str, str], Row] = {}
    for sequence, scope_id, object_id, data in reversed(events):
        found = newest_projection(newest_first, scope_id, object_id, data, sequence)
        if found is not None and not found.relationship:
            newest_first[(scope_id, str(object_id))] = found.row
    assert newest_first == oldest_first and len(newest_first) == 7
    # the latest event of mem:0 (sequence 60) carries no version: its row is the one before (sequence 56)
    assert newest_first[("workspace:rows", "mem:0")][COLUMNS.index("ledger_sequence")] == 56


def test_newest_first_refuses_an_event_filed_under_another_object() -> None:
    with pytest.raises(ValueError, match="filed under"):
        newest_projection({}, "workspace:rows", "mem:other", event(META), 9)
