"""What a role's `{prefix}.status.{role}` answers, and to whom.

Why: status used to answer anyone on the bus with pids, ledger positions and what a stuck follower could
not apply; with auth enforced that is for the operator. Every role answers through `status_reply`: with auth
enforced an unauthenticated caller is refused (`access_denied`, like any request without a credential), an
authenticated one sees the role's health ({role, leader, ok}), and only a caller holding a grant on the
system scope (the administrator) sees the details too (pid, positions, stuck reports). Auth off: everything,
as before. A refusal is counted and logged, not recorded in the ledger: a status request names no scope,
and the followers that answer it have no writer of their own to record it with.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import structlog

from infra.metrics import DENIALS_TOTAL, rule_label
from infra.request_shell import Deny, Policy, authorize, context_of, error_body
from schemas.canonical import canonical_bytes
from schemas.common import SYSTEM_SCOPE

log = structlog.get_logger(__name__)

STATUS_REQUEST = "status"  # the request kind the policy knows status requests by (authz.policy)


def sees_details(policy: Policy, actor_id: str) -> bool:
    """Whether the authenticated `actor_id` may see pids, positions and problems: a grant on the system scope."""
    return not policy.enforced or policy.holds(actor_id, SYSTEM_SCOPE, "read")


def status_reply(policy: Policy, subject: str, headers: Mapping[str, str] | None, health: dict[str, Any],
                 details: Callable[[], dict[str, Any]]) -> bytes:
    """The reply to one status request: `health` ({role, leader, ok}) to any authenticated caller, with
    `details()` for an administrator (its keys win: a role keeps the names it always answered with)."""
    try:
        context = context_of(subject, dict(headers) if headers is not None else None)
        context, decision = authorize(policy, context, None, STATUS_REQUEST)
        if isinstance(decision, Deny):
            DENIALS_TOTAL.labels(rule_label(decision.rule_id)).inc()
            log.info("request.denied", request=STATUS_REQUEST, rule_id=decision.rule_id)
            raise decision.error()
        if not sees_details(policy, context.principal.actor_id):
            return canonical_bytes({"result": health})
        return canonical_bytes({"result": {**health, **details()}})
    except Exception as exc:  # noqa: BLE001 - every failure answers with its error envelope
        return error_body(exc, None, STATUS_REQUEST)
