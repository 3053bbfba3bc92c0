"""[M5] Rules of the object model that the review of the first slice found missing, as tables over the pure core."""

from __future__ import annotations

import msgspec
import pytest

from command_handler.core.decide import decide
from command_handler.core.delegations import exercise_for, operation_of
from command_handler.core.state import Context, ObjectHead
from schemas.commands import DeleteObject, TransitionState
from schemas.errors import PamledgerError
from schemas.redaction import PointerProblem, redacted_projection
from schemas.relationship import Relate
from tests.unit.test_decide import ACTOR, PROV, REGISTRY, command, create, created, stamp

DELEGATED = {**ACTOR, "delegation_id": "del:1"}
RETENTION = {"actor_id": "actor:pamledger:retention", "actor_kind": "service"}


class Grants:
    """An authority holding exactly `ops` in every scope."""

    def __init__(self, *ops: str):
        self.ops = set(ops)

    def holds(self, actor_id: str, scope_id: str, operation: str) -> bool:
        return operation in self.ops

    def administers(self, actor_id: str) -> bool:
        return False


def relationship_head() -> ObjectHead:
    meta = {"relationship_id": "rel:1", "scope_id": "workspace:a", "relationship_type": "supports",
            "availability_state": "available", "retention_state": "retained", "lifecycle_state": "active",
            "validation_state": "unverified", "source_object_id": "mem:a", "target_object_id": "mem:b"}
    return ObjectHead(scope_id="workspace:a", object_id="rel:1", version_id="ver:1", sequence=1, meta=meta,
                      content_digest=None)


def test_a_delegation_restricted_to_types_is_checked_strictly_for_relationships() -> None:
    relate = msgspec.convert({"scope_id": "workspace:a", "source_object_id": "mem:a", "target_object_id": "mem:b",
                              "relationship_type": "supports", "directionality": "directed", "actor": DELEGATED,
                              "provenance": {**PROV, "actor": DELEGATED}}, Relate)
    check = exercise_for(relate, None)
    assert check is not None and (check.object_type, check.strict, check.operation) == ("relationship", True, "relate")
    delete = command(DeleteObject, object_id="rel:1", actor=DELEGATED, provenance={**PROV, "actor": DELEGATED})
    check = exercise_for(delete, relationship_head().meta)
    assert check is not None and (check.object_type, check.strict) == ("relationship", True)


@pytest.mark.parametrize("target, operation", [("redacted", "redact"), ("deleted", "delete"), ("available", "redact")])
def test_an_availability_transition_is_the_redact_or_delete_operation(target: str, operation: str) -> None:
    move = command(TransitionState, dimension="availability", target_state=target)
    assert operation_of(move) == operation
    if target == "available":
        return
    with pytest.raises(PamledgerError) as err:
        decide(created(), move, stamp(2), REGISTRY, Context(authority=Grants("transition")))
    assert err.value.code == "access_denied"
    assert decide(created(), move, stamp(2), REGISTRY, Context(authority=Grants(operation))).head is not None


def test_the_retention_actor_cannot_release_a_legal_hold() -> None:
    held = created(retention_state="legal_hold")
    move = command(TransitionState, dimension="retention", target_state="expired", policy_basis="retention:x",
                   actor=RETENTION, provenance={**PROV, "actor": RETENTION})
    with pytest.raises(PamledgerError) as err:
        decide(held, move, stamp(2), REGISTRY)
    assert err.value.code == "access_denied"


def test_tool_entries_carry_ids_only() -> None:
    """The ledger and its replica are append-only: nothing of a tool's content goes into its entry."""
    made = create(object_type="tool_invocation", canonical_content={"tool_name": "secret-tool-name", "arguments": {}})
    decision = decide(None, made, msgspec.structs.replace(stamp(), spare=tuple(f"u{i}" for i in range(3))), REGISTRY)
    (entry,) = decision.followers
    assert entry.event.event_type == "tool_invoked"
    assert b"secret-tool-name" not in msgspec.json.encode(entry.event)


@pytest.mark.parametrize("pointers", [["/a", "/a/b"], ["/a/b", "/a"], ["/a/b", "/a/b"]])
def test_pointers_resolve_against_the_content_as_it_is_in_any_order(pointers: list[str]) -> None:
    result = redacted_projection({"a": {"b": 1}, "c": 2}, pointers)
    assert result["c"] == 2 and (result["a"] == "[REDACTED]" or result["a"] == {"b": "[REDACTED]"})


def test_a_pointer_that_names_nothing_is_refused_before_anything_is_replaced() -> None:
    with pytest.raises(PointerProblem):
        redacted_projection({"a": {"b": 1}}, ["/a", "/a/x"])


def test_recorded_times_compare_as_text_in_any_year() -> None:
    """A delegation window is compared as text: a year before 1000 must not sort after 2026."""
    from datetime import datetime, timezone

    from schemas.common import timestamp_text

    early, now = datetime(999, 12, 31, tzinfo=timezone.utc), datetime(2026, 12, 1, tzinfo=timezone.utc)
    assert timestamp_text(early) == "0999-12-31T00:00:00.000000Z"
    assert timestamp_text(early) < timestamp_text(now)


def test_a_delegation_lapses_when_its_grantor_loses_the_operation_in_the_scope_acted_on() -> None:
    """Granted with a target scope, a delegation is used in its own scope: the grantor must still hold the
    operation in both, at every use, as when it granted."""
    from datetime import datetime, timezone

    from command_handler.core.delegations import decide_delegation
    from schemas.delegation import CheckDelegation, GrantDelegation

    class Holds:
        def __init__(self, scopes: set[str]):
            self.scopes = scopes

        def holds(self, actor_id: str, scope_id: str, operation: str) -> bool:
            return actor_id != "actor:human:boss" or scope_id in self.scopes

        def administers(self, actor_id: str) -> bool:
            return False

    boss, agent = {"actor_id": "actor:human:boss", "actor_kind": "human"}, {"actor_id": "actor:agent:a",
                                                                           "actor_kind": "agent"}
    when = datetime(2026, 12, 1, tzinfo=timezone.utc)
    grant = msgspec.convert({"scope_id": "workspace:a", "granting_actor": boss, "delegated_actor": agent,
                             "granted_operations": ["create"], "policy_basis": "p", "actor": boss,
                             "not_before": "2026-01-01T00:00:00Z", "not_after": "2027-01-01T00:00:00Z",
                             "target_scope_id": "workspace:b"}, GrantDelegation)
    both = Holds({"workspace:a", "workspace:b"})
    _, state = decide_delegation(grant, None, msgspec.structs.replace(stamp(), now=when), both)
    check = msgspec.convert({"scope_id": "workspace:a", "delegation_id": state.delegation_id,
                             "delegated_actor_id": agent["actor_id"], "operation": "create", "actor": agent},
                            CheckDelegation)
    decide_delegation(check, state, msgspec.structs.replace(stamp(2), now=when), both)  # allowed
    with pytest.raises(PamledgerError) as err:
        decide_delegation(check, state, msgspec.structs.replace(stamp(3), now=when), Holds({"workspace:b"}))
    assert err.value.code == "access_denied"


def test_the_quality_filters_name_every_unit_signal_of_the_envelope() -> None:
    """schemas.queries lists the signals Query filters and orders by; it must follow the envelope's struct."""
    from typing import get_type_hints

    from schemas.common import Unit
    from schemas.envelope import QualitySignals
    from schemas.queries import QUALITY_SIGNALS

    hints = get_type_hints(QualitySignals, include_extras=True)
    assert set(QUALITY_SIGNALS) == {name for name, hint in hints.items() if hint == Unit | None}
