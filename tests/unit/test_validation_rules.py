"""The validation rules of command_handler.core.validation as a table: who may set which validation state."""

from __future__ import annotations

from typing import Any

import msgspec
import pytest

from command_handler.core.state import ObjectHead
from command_handler.core.validation import carried_validation, check_validation, needs_scope_policy
from schemas.commands import CreateObject, TransitionState, UpdateObject
from schemas.errors import AccessDenied

SCOPE = "team:v"
SOD = {"validation": {"separation_of_duties": True}}
PROV = {"provenance_id": "prov:1", "actor": {"actor_id": "actor:a", "actor_kind": "agent"}, "activity": "t"}


class Grants:
    """An authority where only `reviewers` hold validate."""

    def __init__(self, *reviewers: str) -> None:
        self.reviewers = set(reviewers)

    def holds(self, actor_id: str, scope_id: str, operation: str) -> bool:
        return operation != "validate" or actor_id in self.reviewers

    def administers(self, actor_id: str) -> bool:
        return False


def actor(actor_id: str, **extra: Any) -> dict[str, Any]:
    return {"actor_id": actor_id, "actor_kind": "agent", **extra}


def create(who: dict[str, Any], state: str) -> CreateObject:
    return msgspec.convert({"scope_id": SCOPE, "object_type": "claim", "canonical_content": {"statement": "x"},
                            "actor": who, "provenance": {**PROV, "actor": who}, "validation_state": state},
                           CreateObject)


def transition(who: dict[str, Any], target: str, dimension: str = "validation") -> TransitionState:
    return msgspec.convert({"scope_id": SCOPE, "object_id": "mem:1", "expected_version_id": "ver:1",
                            "dimension": dimension, "target_state": target, "actor": who,
                            "provenance": {**PROV, "actor": who}}, TransitionState)


def update(who: dict[str, Any]) -> UpdateObject:
    return msgspec.convert({"scope_id": SCOPE, "object_id": "mem:1", "expected_version_id": "ver:1",
                            "canonical_content": {"statement": "y"}, "actor": who,
                            "provenance": {**PROV, "actor": who}}, UpdateObject)


def head(writer: str, state: str = "unverified") -> ObjectHead:
    return ObjectHead(scope_id=SCOPE, object_id="mem:1", version_id="ver:1", sequence=1, content_digest="d",
                      meta={"actor": actor(writer), "provenance": {"actor": actor(writer)},
                            "validation_state": state})


def rule(call: Any) -> str | None:
    try:
        call()
    except AccessDenied as exc:
        return exc.rule_id
    return None


@pytest.mark.parametrize("command,current,policy,expected", [
    (create(actor("actor:a"), "unverified"), None, None, None),
    (create(actor("actor:a"), "corroborated"), None, None, "authz.validate_not_granted"),
    (create(actor("actor:r"), "corroborated"), None, None, None),
    (create(actor("actor:r"), "corroborated"), None, SOD, "validation.separation_of_duties"),
    (create(actor("actor:r"), "disputed"), None, SOD, None),  # disputing one's own words is no self-promotion
    (transition(actor("actor:a"), "corroborated"), head("actor:b"), None, "authz.validate_not_granted"),
    (transition(actor("actor:a"), "unverified"), head("actor:b", "disputed"), None, None),
    (transition(actor("actor:a"), "active", "lifecycle"), head("actor:a"), SOD, None),
    (transition(actor("actor:r"), "corroborated"), head("actor:r"), None, None),
    (transition(actor("actor:r"), "corroborated"), head("actor:r"), SOD, "validation.separation_of_duties"),
    (transition(actor("actor:r"), "corroborated"), head("actor:b"), SOD, None),
    # Under a delegation: the principal's validate counts, and its own words stay its own.
    (transition(actor("actor:a", on_behalf_of_actor_id="actor:r", delegation_id="del:1"), "corroborated"),
     head("actor:b"), SOD, None),
    (transition(actor("actor:a", on_behalf_of_actor_id="actor:r", delegation_id="del:1"), "corroborated"),
     head("actor:r"), SOD, "validation.separation_of_duties"),
    (transition(actor("actor:r", on_behalf_of_actor_id="actor:a", delegation_id="del:1"), "corroborated"),
     head("actor:b"), None, "authz.validate_not_granted"),
])
def test_who_may_set_a_validation_state(command: Any, current: ObjectHead | None, policy: Any,
                                        expected: str | None) -> None:
    assert rule(lambda: check_validation(command, current, Grants("actor:r"), policy)) == expected


@pytest.mark.parametrize("who,state,policy,expected", [
    ("actor:a", "unverified", None, None),
    ("actor:a", "corroborated", None, "unverified"),  # new words of an actor without validate
    ("actor:r", "corroborated", None, None),
    ("actor:r", "corroborated", SOD, "unverified"),  # its own words now: never corroborated by itself
    ("actor:r", "disputed", SOD, None),
])
def test_what_an_update_carries(who: str, state: str, policy: Any, expected: str | None) -> None:
    assert carried_validation(update(actor(who)), head("actor:b", state), Grants("actor:r"), policy) == expected


def test_the_writer_loads_the_policy_for_the_commands_that_read_it() -> None:
    assert needs_scope_policy(update(actor("actor:a")))
    assert needs_scope_policy(create(actor("actor:a"), "corroborated"))
    assert not needs_scope_policy(create(actor("actor:a"), "unverified"))
    assert not needs_scope_policy(transition(actor("actor:a"), "active", "lifecycle"))
