"""The ledger's vocabulary as types: one Struct per event type, envelopes that are the spec's without content,
followers' views that name only fields the types have, and a ledger from before the types that decodes into
them and encodes back to its very bytes."""

from __future__ import annotations

import base64
import json
from pathlib import Path
from typing import Any

import msgspec
import pytest

from schemas import event_views
from schemas.canonical import canonical_bytes
from schemas.envelope import MemoryVersion
from schemas.errors import InvalidRequest
from schemas.events import (
    EVENT_TYPES, AnyEnvelope, Event, EventType, ObjectEnvelope, RelationshipEnvelope, decode_event, event_of,
)
from tests.conftest import PAMSPEC

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "ledger_before_typed_events.json"
SCHEMAS = PAMSPEC / "schemas" / "0.1-draft"


def names(cls: type[Any]) -> set[str]:
    return {f.encode_name for f in msgspec.structs.fields(cls)}


def structs_in(info: msgspec.inspect.Type) -> list[type[Any]]:
    """The Struct classes a field's type names (through unions, optionals and lists)."""
    if isinstance(info, msgspec.inspect.StructType):
        return [info.cls]
    if isinstance(info, msgspec.inspect.UnionType):
        return [c for t in info.types for c in structs_in(t)]
    if isinstance(info, (msgspec.inspect.ListType, msgspec.inspect.TupleType)):
        inner = getattr(info, "item_type", None)
        return structs_in(inner) if inner is not None else []
    return []


def not_in_types(view: type[Any], full: list[type[Any]], path: str = "") -> list[str]:
    """The view's fields (by path) that no full type in `full` has; nested views are held to the nested
    types of the full types' same-named fields. A field the full type holds as plain JSON (Any, dict, Raw)
    may be viewed as anything."""
    missing = []
    for field in msgspec.inspect.type_info(view).fields:
        owners = [f for cls in full for f in msgspec.inspect.type_info(cls).fields if f.encode_name == field.encode_name]
        tags = {getattr(msgspec.inspect.type_info(cls), "tag_field", None) for cls in full}
        if not owners and field.encode_name not in tags:
            missing.append(path + field.encode_name)
            continue
        nested_views = structs_in(field.type)
        nested_full = [c for f in owners for c in structs_in(f.type)]
        if nested_views and nested_full:
            for nested in nested_views:
                missing += not_in_types(nested, nested_full, path + field.encode_name + ".")
    return missing


ALL_EVENTS = list(EVENT_TYPES.values())


@pytest.mark.parametrize("view", [event_views.ProjectedEvent, event_views.IndexedEvent])
def test_each_followers_view_names_only_fields_the_events_have(view: type[Any]) -> None:
    assert not_in_types(view, ALL_EVENTS) == []


@pytest.mark.parametrize(("view", "full"), [
    (event_views.ProjectedObject, [ObjectEnvelope, AnyEnvelope]),
    (event_views.ProjectedRelationship, [RelationshipEnvelope, AnyEnvelope]),
])
def test_the_projectors_envelope_views_name_only_envelope_fields(view: type[Any], full: list[type[Any]]) -> None:
    assert not_in_types(view, full) == []


class _WrongPayload(msgspec.Struct):
    content_digest: str | None = None
    color: str | None = None


class _WrongView(msgspec.Struct):
    object_id: str | None = None
    payload: _WrongPayload | None = None
    flavour: str = ""


def test_the_subset_check_finds_a_field_no_event_has() -> None:
    assert not_in_types(_WrongView, ALL_EVENTS) == ["payload.color", "flavour"]


def test_an_object_envelope_is_a_memory_version_without_its_content() -> None:
    assert names(ObjectEnvelope) == names(MemoryVersion) - {"canonical_content"}


def test_a_relationship_envelope_is_the_spec_relationship_without_its_content() -> None:
    schema = SCHEMAS / "relationship.schema.json"
    if not schema.is_file():
        pytest.skip(f"the PAMSPEC schemas are not at {SCHEMAS} (../shared is absent)")
    properties = set(json.loads(schema.read_text())["properties"])
    assert names(RelationshipEnvelope) == properties - {"canonical_content"}


def test_either_envelope_has_every_field_of_both() -> None:
    assert names(AnyEnvelope) == names(ObjectEnvelope) | names(RelationshipEnvelope)


def test_there_is_one_type_per_event_type_of_the_spec() -> None:
    assert set(EVENT_TYPES) == set(EventType.__args__)  # type: ignore[attr-defined]
    schema = SCHEMAS / "memory-event.schema.json"
    if schema.is_file():
        assert set(EVENT_TYPES) == set(json.loads(schema.read_text())["properties"]["event_type"]["enum"])


def old_events() -> list[bytes]:
    rows = json.loads(FIXTURE.read_text())["tables"]["ledger"]
    return [base64.b64decode(r["event"]["base64"]) for r in rows]


def test_a_ledger_from_before_the_types_decodes_into_them_and_encodes_to_its_bytes() -> None:
    events = old_events()
    decoded = [decode_event(raw) for raw in events]
    assert [canonical_bytes(e) for e in decoded] == events
    assert len({type(e) for e in decoded}) == 21


def test_the_writer_cannot_build_an_event_its_type_does_not_describe() -> None:
    created = next(e for e in map(decode_event, old_events()) if e.event_type == "object_created")
    fields = {name: getattr(created, name) for name in (
        "event_id", "operation_id", "scope_id", "recorded_at", "sequence", "actor", "object_id", "version_id")}
    payload = msgspec.to_builtins(created.payload)
    assert event_of("object_created", payload, **fields) == created
    with pytest.raises(InvalidRequest, match="previous_version_id"):
        event_of("object_updated", payload, **fields)  # an update names the version it follows
    with pytest.raises(InvalidRequest, match="content_digest"):
        event_of("object_created", {**payload, "content_digest": 7}, **fields)


def test_a_decoded_event_says_its_type() -> None:
    event: Event = decode_event(old_events()[0])
    assert event.event_type == json.loads(old_events()[0])["event_type"]
