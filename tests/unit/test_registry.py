"""The type registry: the default one is today's tables, and the core decides by whichever registry it is handed."""

from __future__ import annotations

import dataclasses
from typing import Any

import msgspec
import pytest

from schemas.auth import AUTH_CONTENT_SCHEMAS

from command_handler.core.chain import GENESIS_HASH
from command_handler.core.decide import decide
from command_handler.core.intake import parse
from command_handler.core.planner import PlanInputs, plan_batch
from command_handler.core.state import ObjectHead
from command_handler.stamps import new_stamp
from schemas.commands import TransitionState, UpdateObject
from schemas.common import DIMENSION_STATES, EXTENSION_TYPE_PATTERNS, STANDARD_OBJECT_TYPES
from schemas.content import CONTENT_SCHEMAS
from schemas.errors import PamledgerError
from schemas.registry import TypeRegistry, default_registry, with_object_type, with_transition
from schemas.transitions import TRANSITIONS
from tests.unit.test_decide import ACTOR, PROV, command, create, stamp

DEFAULT = default_registry()


class NoteContent(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    text: str


def code_of(head: ObjectHead | None, cmd: Any, registry: TypeRegistry) -> str:
    with pytest.raises(PamledgerError) as err:
        decide(head, cmd, stamp(2), registry)
    return err.value.code


def test_the_default_registry_holds_todays_tables() -> None:
    assert DEFAULT.object_types == STANDARD_OBJECT_TYPES
    assert DEFAULT.extension_patterns == EXTENSION_TYPE_PATTERNS
    assert dict(DEFAULT.content_schemas) == {**CONTENT_SCHEMAS, **AUTH_CONTENT_SCHEMAS}  # actors, credentials
    assert {dim: dict(table) for dim, table in DEFAULT.transitions.items()} == TRANSITIONS
    assert dict(DEFAULT.states) == DIMENSION_STATES  # the tables name every state of the wire Literals
    assert DEFAULT.lifecycle_at_creation("working_memory") == "scratch"
    assert DEFAULT.lifecycle_at_creation("claim") == "active"
    assert default_registry() == DEFAULT


def test_a_registry_cannot_be_changed_in_place() -> None:
    with pytest.raises(dataclasses.FrozenInstanceError):
        DEFAULT.object_types = frozenset({"note"})  # type: ignore[misc]
    with pytest.raises(TypeError):
        DEFAULT.transitions["lifecycle"]["archived"] = ("scratch",)  # type: ignore[index]
    with pytest.raises(TypeError):
        DEFAULT.content_schemas["note"] = NoteContent  # type: ignore[index]


def test_an_installed_object_type_is_accepted_where_the_default_refuses_it() -> None:
    assert code_of(None, create(object_type="note"), DEFAULT) == "unsupported_object_type"
    extended = with_object_type(DEFAULT, "note")
    decision = decide(None, create(object_type="note"), stamp(), extended)
    assert decision.head is not None and decision.head.meta["object_type"] == "note"
    assert "note" not in DEFAULT.object_types  # adding a type returns a new registry
    assert code_of(None, create(object_type="note"), DEFAULT) == "unsupported_object_type"


def test_an_installed_types_content_schema_checks_creates_and_updates() -> None:
    extended = with_object_type(DEFAULT, "note", content_schema=NoteContent)
    bad = create(object_type="note", canonical_content={"text": "x", "extra": 1})
    assert code_of(None, bad, extended) == "invalid_object"
    head = decide(None, create(object_type="note", canonical_content={"text": "x"}), stamp(), extended).head
    assert code_of(head, command(UpdateObject, canonical_content={"text": 1}), extended) == "invalid_object"
    assert decide(head, command(UpdateObject, canonical_content={"text": "y"}), stamp(2), extended).head is not None


def test_an_installed_type_starts_in_its_own_lifecycle_state() -> None:
    extended = with_object_type(DEFAULT, "note", initial_lifecycle="candidate")
    head = decide(None, create(object_type="note"), stamp(), extended).head
    assert head is not None and head.meta["lifecycle_state"] == "candidate"
    with pytest.raises(ValueError):
        with_object_type(DEFAULT, "note", initial_lifecycle="nowhere")


def test_an_added_transition_is_accepted_where_the_default_refuses_it() -> None:
    head = decide(None, create(), stamp(), DEFAULT).head
    back_to_scratch = command(TransitionState, dimension="lifecycle", target_state="scratch")
    assert code_of(head, back_to_scratch, DEFAULT) == "invalid_state_transition"
    extended = with_transition(DEFAULT, "lifecycle", "active", "scratch")
    moved = decide(head, back_to_scratch, stamp(2), extended).head
    assert moved is not None and moved.meta["lifecycle_state"] == "scratch"
    assert "scratch" not in DEFAULT.allowed_targets("lifecycle", "active")
    assert with_transition(extended, "lifecycle", "active", "scratch") == extended  # adding twice changes nothing


def test_an_added_transition_may_lead_to_a_new_state() -> None:
    head = decide(None, create(), stamp(), DEFAULT).head
    review = command(TransitionState, dimension="validation", target_state="under_review")
    assert code_of(head, review, DEFAULT) == "invalid_state_transition"
    extended = with_transition(DEFAULT, "validation", "unverified", "under_review")
    moved = decide(head, review, stamp(2), extended).head
    assert moved is not None and moved.meta["validation_state"] == "under_review"
    assert extended.allowed_targets("validation", "under_review") == ()


def test_the_planner_decides_by_the_registry_in_its_inputs() -> None:
    body = {"scope_id": "workspace:a", "object_type": "note", "canonical_content": {"text": "x"},
            "actor": ACTOR, "provenance": PROV}
    items: list[Any] = [parse("create", msgspec.json.encode(body), {}, 1 << 20)]

    def planned(registry: TypeRegistry) -> Any:
        inputs = PlanInputs(heads={}, idempotency={}, scope_known=lambda _: True, stamp=new_stamp,
                            tail=(0, GENESIS_HASH), registry=registry)
        return plan_batch(items, inputs).outcomes[0]

    refused = planned(DEFAULT)
    assert refused.error is not None and refused.error.code == "unsupported_object_type"
    accepted = planned(with_object_type(DEFAULT, "note", content_schema=NoteContent))
    assert accepted.error is None and accepted.accepted is not None
