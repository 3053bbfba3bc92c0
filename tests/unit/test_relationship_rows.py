"""The pure relationship projection: a Relationship Version's event -> its current_relationships row."""

from __future__ import annotations

from projector.rows import RELATIONSHIP_COLUMNS, Row, fold, newest_projection, project, relationship_row
from schemas.canonical import canonical_bytes

REL = {
    "relationship_id": "rel:1", "scope_id": "workspace:rows", "version_id": "ver:r1", "sequence": 1,
    "relationship_type": "supports", "source_object_id": "mem:a", "target_object_id": "mem:b",
    "directionality": "directed", "lifecycle_state": "active", "availability_state": "available",
    "retention_state": "retained", "validation_state": "unverified",
    "actor": {"actor_id": "actor:agent:x", "actor_kind": "agent"}, "provenance": {"provenance_id": "prov:1"},
    "committed_at": "2026-12-01T20:00:00Z", "recorded_at": "2026-12-01T20:00:00Z",
}


def rel_event(meta: object, relationship_id: str = "rel:1") -> bytes:
    return canonical_bytes({"event_type": "relationship_created", "relationship_id": relationship_id,
                            "scope_id": "workspace:rows", "payload": {"envelope": meta, "content_digest": "sha256:cd"}})


def obj_event(object_id: str, sequence: int) -> bytes:
    meta = {"scope_id": "workspace:rows", "object_id": object_id, "version_id": f"ver:{sequence}", "sequence": sequence,
            "object_type": "claim", "lifecycle_state": "active", "availability_state": "available",
            "retention_state": "retained", "validation_state": "unverified",
            "actor": {"actor_id": "actor:agent:x", "actor_kind": "agent"}, "provenance": {"provenance_id": "prov:1"},
            "committed_at": "2026-12-01T20:00:00Z", "recorded_at": "2026-12-01T20:00:00Z"}
    return canonical_bytes({"event_type": "object_updated", "object_id": object_id, "scope_id": "workspace:rows",
                            "payload": {"envelope": meta, "content_digest": "sha256:ab"}})


def test_a_relationship_row_carries_its_endpoints_states_and_envelope_bytes() -> None:
    row = relationship_row(rel_event(REL), 7)
    assert row is not None and len(row) == len(RELATIONSHIP_COLUMNS)
    values = dict(zip(RELATIONSHIP_COLUMNS, row))
    assert values["target_scope_id"] == "workspace:rows", "same-scope: the target's scope is the relationship's"
    assert (values["ledger_sequence"], values["content_digest"], values["actor_id"]) == (7, "sha256:cd", "actor:agent:x")
    assert values["meta"] == canonical_bytes(REL)
    crossing = relationship_row(rel_event({**REL, "target_scope_id": "workspace:other"}), 8)
    assert crossing is not None and dict(zip(RELATIONSHIP_COLUMNS, crossing))["target_scope_id"] == "workspace:other"


def test_project_tells_objects_from_relationships_and_skips_event_only_entries() -> None:
    found = project(rel_event(REL), 1)
    assert found is not None and found.relationship and found.row[1] == "rel:1"
    found = project(obj_event("mem:a", 1), 2)
    assert found is not None and not found.relationship and found.row[1] == "mem:a"
    assert project(rel_event(None), 3) is None
    assert project(canonical_bytes({"event_type": "tool_invoked", "payload": {}}), 4) is None
    assert relationship_row(obj_event("mem:a", 1), 5) is None


def test_newest_first_gives_the_same_rows_as_ledger_order_for_both_tables() -> None:
    events: list[tuple[int, str, bytes]] = []
    for sequence in range(1, 41):
        if sequence % 3:
            key = f"rel:{sequence % 4}"
            events.append((sequence, key, rel_event({**REL, "relationship_id": key, "sequence": sequence,
                                                     "version_id": f"ver:{sequence}"}, key)))
        else:
            key = f"mem:{sequence % 5}"
            events.append((sequence, key, obj_event(key, sequence)))
    oldest: tuple[dict[tuple[str, str], Row], dict[tuple[str, str], Row]] = ({}, {})
    for sequence, _, data in events:
        found = project(data, sequence)
        assert found is not None
        fold(oldest[found.relationship], found.row)
    newest: tuple[dict[tuple[str, str], Row], dict[tuple[str, str], Row]] = ({}, {})
    seen: set[tuple[str, str]] = set()
    for sequence, key, data in reversed(events):
        found = newest_projection(seen, "workspace:rows", key, data, sequence)
        if found is not None:
            seen.add(("workspace:rows", key))
            newest[found.relationship][(found.row[0], found.row[1])] = found.row
    assert newest == oldest and len(oldest[True]) == 4 and len(oldest[False]) == 5
