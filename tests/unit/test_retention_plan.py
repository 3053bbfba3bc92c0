"""The retention evaluator's pure planning, the command it sends, and who may send it (auth enforced).

Why: expiration must only ever be proposed for `retained` objects past a rule, as an explicit transition
naming its rule; a legal hold is never proposed, and the service's credential may send transitions in the
retention actor's name only.
"""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from typing import Any

import msgspec
import pytest

from authz.policy import RETENTION_ACTOR_ID, SERVICE_ACTOR_ID, Caller, Denied, authorize
from pamledger.supervisor import ROLES, enabled_optional_roles, parse_roles
from retention.plan import Candidate, Proposal, plan, propose, scope_rules, tally, transition_command
from schemas.auth import Claim
from schemas.auth import ActorRecord
from schemas.commands import TransitionState

NOW = datetime(2026, 12, 1, 12, 0, tzinfo=timezone.utc)
ACTOR = {"actor_id": RETENTION_ACTOR_ID, "actor_kind": "service"}


def candidate(retention: str = "retained", availability: str = "available", valid_until: datetime | None = None,
              age_days: float = 1, scope: str = "workspace:a", object_id: str = "mem:1") -> Candidate:
    return Candidate(scope, object_id, "ver:1", retention, availability, valid_until,
                     NOW - timedelta(days=age_days))


RULES = scope_rules([("workspace:a", {"retention": {"expire_after_days": 30}})])
PAST, FUTURE = NOW - timedelta(seconds=1), NOW + timedelta(days=1)


@pytest.mark.parametrize("case, rule", [
    (candidate(valid_until=PAST), "valid_until"),
    (candidate(valid_until=PAST, age_days=400), "valid_until"),  # valid_until names the basis first
    (candidate(valid_until=FUTURE), None),
    (candidate(valid_until=NOW), None),  # valid until now: not yet past
    (candidate(age_days=31), "scope_policy"),
    (candidate(age_days=29), None),
    (candidate(age_days=31, scope="workspace:b"), None),  # no policy there
    (candidate(valid_until=PAST, retention="legal_hold"), None),
    (candidate(age_days=31, retention="legal_hold"), None),
    (candidate(valid_until=PAST, retention="expired"), None),
    (candidate(valid_until=PAST, retention="pending_deletion"), None),
    (candidate(valid_until=PAST, availability="deleted"), None),
    (candidate(valid_until=PAST, availability="redacted"), "valid_until"),  # a tombstone still expires
], ids=["valid-until-past", "both-rules", "valid-until-future", "valid-until-now", "older-than-policy",
        "younger-than-policy", "no-policy", "hold-valid-until", "hold-policy", "already-expired",
        "pending-deletion", "deleted", "redacted"])
def test_which_objects_are_proposed(case: Candidate, rule: str | None) -> None:
    proposal = propose(case, RULES, NOW)
    assert (proposal.rule if proposal else None) == rule
    if proposal is not None:
        assert proposal.expected_version_id == "ver:1"
        assert proposal.policy_basis == {"valid_until": "retention:valid_until",
                                         "scope_policy": "retention:scope-policy:expire_after_days=30"}[rule]


@pytest.mark.parametrize("policy, days, problem", [
    (None, None, False), ({}, None, False), ({"retention": {"mode": "x"}}, None, False),
    ({"retention": {"expire_after_days": 7}}, 7, False),
    ({"retention": {"expire_after_days": 0}}, None, True), ({"retention": {"expire_after_days": -3}}, None, True),
    ({"retention": {"expire_after_days": "30"}}, None, True), ({"retention": {"expire_after_days": 1.5}}, None, True),
    ({"retention": {"expire_after_days": True}}, None, True), ({"retention": 30}, None, True),
    ({"retention": {"expire_after_days": 36_501}}, None, True),
])
def test_scope_policies_are_read_or_reported(policy: Any, days: int | None, problem: bool) -> None:
    rules = scope_rules([("workspace:s", policy)])
    assert rules.expire_after_days.get("workspace:s") == days
    assert bool(rules.problems) is problem


def test_plan_keeps_candidate_order_and_counts_rules() -> None:
    found = plan([candidate(valid_until=PAST, object_id="mem:1"), candidate(object_id="mem:2"),
                  candidate(age_days=40, object_id="mem:3")], RULES, NOW)
    assert [p.object_id for p in found] == ["mem:1", "mem:3"]
    assert tally(found) == {"valid_until": 1, "scope_policy": 1}
    assert found[0].as_json()["policy_basis"] == "retention:valid_until"


def test_the_command_is_a_valid_retention_transition_with_its_own_actor_and_basis() -> None:
    proposal = Proposal("workspace:a", "mem:1", "ver:7", "scope_policy", "retention:scope-policy:expire_after_days=30")
    body = transition_command(proposal, ACTOR)
    command = msgspec.convert(body, TransitionState)
    assert (command.dimension, command.target_state, command.expected_version_id) == ("retention", "expired", "ver:7")
    assert command.actor.actor_id == RETENTION_ACTOR_ID and command.actor.actor_kind == "service"
    assert command.policy_basis == "retention:scope-policy:expire_after_days=30" and not command.policy_override
    assert command.provenance.source_ref == command.policy_basis
    # the same proposal is the same command (a resend is deduplicated); another version is another one
    assert transition_command(proposal, ACTOR)["idempotency_key"] == body["idempotency_key"]
    other = Proposal("workspace:a", "mem:1", "ver:8", "scope_policy", proposal.policy_basis)
    assert transition_command(other, ACTOR)["idempotency_key"] != body["idempotency_key"]


SERVICE = Caller(ActorRecord(actor_id=SERVICE_ACTOR_ID, actor_kind="service"), "0" * 16, internal=True)
AGENT = Caller(ActorRecord(actor_id="actor:agent:a", actor_kind="agent"), "1" * 16)


@pytest.mark.parametrize("caller, request_kind, claim, allowed", [
    (SERVICE, "cmd.transition", Claim(RETENTION_ACTOR_ID), True),
    (SERVICE, "cmd.transition", Claim("actor:pamledger:admin"), False),  # never in anyone else's name
    (SERVICE, "cmd.transition", Claim(RETENTION_ACTOR_ID, delegation_id="del:1"), False),
    (SERVICE, "cmd.transition", Claim(RETENTION_ACTOR_ID, on_behalf_of_actor_id="actor:x"), False),
    (SERVICE, "cmd.transition", None, False),
    (SERVICE, "cmd.delete", Claim(RETENTION_ACTOR_ID), False),
    (SERVICE, "cmd.redact", Claim(RETENTION_ACTOR_ID), False),
    (AGENT, "cmd.transition", Claim(RETENTION_ACTOR_ID), False),  # an agent cannot pose as the evaluator
])
def test_the_service_credential_sends_transitions_as_the_retention_actor_only(
        caller: Caller, request_kind: str, claim: Claim | None, allowed: bool) -> None:
    outcome = authorize(caller, request_kind, "workspace:a", claim)
    assert (outcome is None) is allowed, outcome
    if not allowed:
        assert isinstance(outcome, Denied)


def test_the_retention_role_is_off_unless_enabled_or_named() -> None:
    assert "retention" not in parse_roles("all") and "retention" not in ROLES
    assert parse_roles("all", enabled_optional_roles(True))[-1] == "retention"
    assert parse_roles("all", enabled_optional_roles(False)) == ROLES
    assert parse_roles("retention") == ("retention",)
    assert parse_roles("writer,retention") == ("writer", "retention")
    with pytest.raises(ValueError):
        parse_roles("writer,retension")


def test_retention_settings_are_read_from_the_environment_and_checked(monkeypatch: pytest.MonkeyPatch) -> None:
    from pydantic import ValidationError

    from infra.settings import Settings

    defaults = Settings().retention
    assert (defaults.enabled, defaults.every_seconds, defaults.max_per_round) == (False, 3600.0, 10_000)
    monkeypatch.setenv("PAMLEDGER_RETENTION__ENABLED", "true")
    monkeypatch.setenv("PAMLEDGER_RETENTION__EVERY_SECONDS", "60")
    assert (Settings().retention.enabled, Settings().retention.every_seconds) == (True, 60.0)
    monkeypatch.setenv("PAMLEDGER_RETENTION__EVERY_SECONDS", "0")
    with pytest.raises(ValidationError):
        Settings()
