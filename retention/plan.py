"""Which objects the retention evaluator proposes to expire, and the Transition command of each. Pure: the
clock, the candidates and the scopes' policies arrive as inputs.

PAMSPEC 9.6: expiration changes Retention State to `expired` and never Lifecycle State by itself; 16.2:
retention policy is part of the scope. The evaluator only proposes: every expiration is an explicit
`transition` command of the retention dimension, with its own actor and a policy basis naming the rule that
fired, decided by the writer like any other command (expected version, the 9.5 table). An object that moved
since it was read (a legal hold placed, a new version) is refused with version_conflict and looked at again
next round; it is never expired on stale state.

Rules, in order (the first that fires names the basis):
- `retention:valid_until`: the current version's valid_until is in the past.
- `retention:scope-policy:expire_after_days=N`: the scope's policy (scopes.policy) holds
  `{"retention": {"expire_after_days": N}}`, N a positive integer, and the object was created more than N
  days ago (its first version's commit time).
Only objects in retention state `retained` are proposed: legal_hold, pending_deletion and expired ones never
are, nor deleted objects.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, Literal

VALID_UNTIL_BASIS = "retention:valid_until"
ACTIVITY = "retention.expire"
MAX_DAYS = 36_500  # a hundred years: past it a policy is a typo, not a retention period

Rule = Literal["valid_until", "scope_policy"]


def scope_policy_basis(days: int) -> str:
    return f"retention:scope-policy:expire_after_days={days}"


@dataclass(frozen=True)
class Candidate:
    """What the evaluator reads of one current object (current_objects and its first version)."""

    scope_id: str
    object_id: str
    version_id: str
    retention_state: str
    availability_state: str
    valid_until: datetime | None
    created_at: datetime


@dataclass(frozen=True)
class Proposal:
    """One expiration to propose: the object, the version it was decided on, the rule and its basis."""

    scope_id: str
    object_id: str
    expected_version_id: str
    rule: Rule
    policy_basis: str

    def as_json(self) -> dict[str, str]:
        return {"scope_id": self.scope_id, "object_id": self.object_id,
                "expected_version_id": self.expected_version_id, "rule": self.rule, "policy_basis": self.policy_basis}


@dataclass(frozen=True)
class ScopeRules:
    """expire_after_days per scope whose policy sets it, and the policies that could not be read (ignored)."""

    expire_after_days: Mapping[str, int] = field(default_factory=dict)
    problems: tuple[dict[str, str], ...] = ()

    def cutoffs(self, now: datetime) -> dict[str, datetime]:
        """Per scope: objects created before this instant are past the scope's retention."""
        return {scope: now - timedelta(days=days) for scope, days in self.expire_after_days.items()}


def scope_rules(policies: Iterable[tuple[str, Any]]) -> ScopeRules:
    """The retention rule of each (scope_id, policy) whose policy has a `retention` member."""
    days: dict[str, int] = {}
    problems: list[dict[str, str]] = []
    for scope_id, policy in policies:
        retention = policy.get("retention") if isinstance(policy, dict) else None
        if retention is None:
            continue
        if isinstance(retention, dict) and "expire_after_days" not in retention:
            continue  # other retention settings: not this evaluator's
        value = retention.get("expire_after_days") if isinstance(retention, dict) else None
        if isinstance(value, int) and not isinstance(value, bool) and 0 < value <= MAX_DAYS:
            days[scope_id] = value
        else:
            problems.append({"scope_id": scope_id, "reason": "policy.retention.expire_after_days must be an integer"
                                                             f" from 1 to {MAX_DAYS} (days)"})
    return ScopeRules(days, tuple(problems))


def propose(candidate: Candidate, rules: ScopeRules, now: datetime) -> Proposal | None:
    """The expiration of `candidate` as of `now`, or None when no rule fires (or it must not be proposed)."""
    if candidate.retention_state != "retained" or candidate.availability_state == "deleted":
        return None
    rule: Rule
    if candidate.valid_until is not None and candidate.valid_until < now:
        rule, basis = "valid_until", VALID_UNTIL_BASIS
    else:
        days = rules.expire_after_days.get(candidate.scope_id)
        if days is None or candidate.created_at >= now - timedelta(days=days):
            return None
        rule, basis = "scope_policy", scope_policy_basis(days)
    return Proposal(candidate.scope_id, candidate.object_id, candidate.version_id, rule, basis)


def plan(candidates: Iterable[Candidate], rules: ScopeRules, now: datetime) -> list[Proposal]:
    """Every proposal, in the order of the candidates."""
    return [p for p in (propose(c, rules, now) for c in candidates) if p is not None]


def transition_command(proposal: Proposal, actor: Mapping[str, str]) -> dict[str, Any]:
    """The `transition` command body of a proposal. Its idempotency key is a function of the object, the
    version and the basis, so a command resent after a lost reply is answered from the ledger, not repeated."""
    digest = hashlib.sha256("\0".join((proposal.scope_id, proposal.object_id, proposal.expected_version_id,
                                       proposal.policy_basis)).encode()).hexdigest()[:40]
    return {"scope_id": proposal.scope_id, "object_id": proposal.object_id,
            "expected_version_id": proposal.expected_version_id, "dimension": "retention", "target_state": "expired",
            "actor": dict(actor), "provenance": {"provenance_id": f"prov:retention:{digest}", "actor": dict(actor),
                                                 "activity": ACTIVITY, "source_ref": proposal.policy_basis},
            "policy_basis": proposal.policy_basis, "idempotency_key": f"retention:{digest}"}


def tally(proposals: Iterable[Proposal]) -> dict[str, int]:
    """How many proposals each rule made."""
    counts = {"valid_until": 0, "scope_policy": 0}
    for proposal in proposals:
        counts[proposal.rule] += 1
    return counts
