"""PAMSPEC-Delegation's rules, decided by the writer's pure core: grant, check (a counted use) and revoke.

Pure: the delegation's current state, the time and the grants the actors hold are inputs (`Authority`), so
the rules are tested as tables. The planner threads each delegation's state through a batch, so two checks
of one delegation in one batch see each other's use: usage counting is exact however many clients race.

A check passes when, in this order: the delegation exists in this scope (`delegation.not_found`), is not
revoked (`delegation.revoked`), names this delegated actor (`delegation.actor_mismatch`), the time is inside
[not_before, not_after] (`delegation.outside_window`), the operation is granted
(`delegation.operation_not_granted`), the object and its type are among those granted, when restricted
(`delegation.object_not_granted`, `delegation.object_type_not_granted`), the grantor still holds the
operation (`delegation.grantor_lacks_operation`), and a use is left (`delegation.usage_exhausted`).
"""

from __future__ import annotations

from typing import Any

import msgspec

from authz.policy import REQUEST_OPERATIONS
from command_handler.core.state import Authority, Decision, Stamp
from command_handler.core.versions import in_run
from schemas.common import timestamp_text
from schemas.common import SYSTEM_SCOPE
from schemas.delegation import (
    DELEGATION_SPEC_VERSION,
    CheckDelegation,
    DelegationCommand,
    DelegationState,
    GrantDelegation,
    RevokeDelegation,
)
from schemas.commands import (
    CreateObject,
    ObjectCommand,
    Promote,
    TransitionState,
)
from schemas.relationship import Relate, is_relationship
from schemas.errors import AccessDenied, InvalidObject, InvalidRequest
from schemas.events import Event, event_of

RELATIONSHIP_TYPE = "relationship"  # what a delegation's granted_object_types names to cover Relationship Objects


def _grantor_lacks(authority: Authority, grantor: str, scopes: set[str], operations: Any) -> bool:
    """Whether the grantor misses one of `operations` in one of `scopes` (the delegation's scope and its target
    scope): checked when it grants and at every use, so a grant lapses when the grantor loses what it gave."""
    return any(not authority.holds(grantor, scope, op) for scope in scopes for op in operations)


def _denied(rule: str, message: str, code: str = "access_denied") -> AccessDenied:
    return AccessDenied(message, rule_id=rule, code=code)  # type: ignore[arg-type]


def decide_delegation(command: DelegationCommand, state: DelegationState | None, stamp: Stamp,
                      authority: Authority) -> tuple[Decision, DelegationState]:
    """The entry a delegation command writes and the delegation's state after it, or raise."""
    if isinstance(command, GrantDelegation):
        return _grant(command, state, stamp, authority)
    if state is None or state.scope_id != command.scope_id:
        raise _denied("delegation.not_found", "no such delegation in this scope")
    if isinstance(command, RevokeDelegation):
        return _revoke(command, state, stamp, authority)
    return _check(command, state, stamp, authority)


def _event(command: DelegationCommand, stamp: Stamp, event_type: str, payload: dict[str, Any]) -> Event:
    return event_of(event_type, in_run(payload, stamp), event_id=stamp.event_id,  # type: ignore[no-any-return]
                    operation_id=stamp.operation_id, scope_id=command.scope_id, recorded_at=stamp.now, sequence=1,
                    actor=command.actor)


def _grant(command: GrantDelegation, state: DelegationState | None, stamp: Stamp,
           authority: Authority) -> tuple[Decision, DelegationState]:
    if command.not_before > command.not_after:
        raise _denied("delegation.window_inverted", "not_before is later than not_after", "policy_denied")
    if len(set(command.granted_operations)) != len(command.granted_operations):
        raise InvalidRequest("granted_operations names an operation twice",
                             details={"granted_operations": list(command.granted_operations)})
    granting = command.granting_actor.actor_id
    if command.actor.actor_id != granting and not authority.administers(command.actor.actor_id):
        raise _denied("delegation.not_grantor", "only the granting actor (or an administrator) records its grants")
    if command.scope_id == SYSTEM_SCOPE or command.target_scope_id == SYSTEM_SCOPE:
        raise _denied("delegation.system_scope", "the system scope cannot be delegated", "policy_denied")
    if _grantor_lacks(authority, granting, {command.scope_id, command.target_scope_id or command.scope_id},
                      command.granted_operations):
        raise _denied("delegation.grantor_lacks_operation", "the grantor does not hold what it grants")
    delegation_id = command.delegation_id or f"del:{stamp.event_id.removeprefix('evt:')}"
    if state is not None:
        raise InvalidRequest("this delegation_id is taken", details={"delegation_id": delegation_id})
    when = timestamp_text(stamp.now)
    grant = {
        "spec_version": DELEGATION_SPEC_VERSION, "delegation_id": delegation_id, "version_id": stamp.version_id,
        "scope_id": command.scope_id, "granting_actor": msgspec.to_builtins(command.granting_actor),
        "delegated_actor": msgspec.to_builtins(command.delegated_actor),
        "granted_operations": list(command.granted_operations), "policy_basis": command.policy_basis,
        "not_before": timestamp_text(command.not_before), "not_after": timestamp_text(command.not_after),
        "revocable": command.revocable, "lifecycle_state": "active", "availability_state": "available",
        "retention_state": "retained", "validation_state": "corroborated", "committed_at": when,
        "recorded_at": when, "sequence": 1, "actor": msgspec.to_builtins(command.actor),
        "provenance": {"provenance_id": f"prov:{delegation_id}", "actor": msgspec.to_builtins(command.actor),
                       "activity": "granted_delegation", "recorded_at": when},
    }
    for name in ("usage_limit", "granted_object_ids", "granted_object_types", "target_scope_id"):
        value = getattr(command, name)
        if value is not None:
            grant[name] = list(value) if isinstance(value, list) else value
    event = _event(command, stamp, "delegation_granted", {"delegation": grant})
    return (Decision(event=event, head=None, result={"delegation_id": delegation_id, "delegation": grant}),
            DelegationState(delegation_id=delegation_id, scope_id=command.scope_id, grant=grant))


def _revoke(command: RevokeDelegation, state: DelegationState, stamp: Stamp,
            authority: Authority) -> tuple[Decision, DelegationState]:
    grantor = state.grant["granting_actor"]["actor_id"]
    if command.actor.actor_id != grantor and not authority.administers(command.actor.actor_id):
        raise _denied("delegation.not_grantor", "only the granting actor (or an administrator) revokes it")
    if not state.grant.get("revocable", True):
        raise _denied("delegation.not_revocable", "this delegation was granted as not revocable", "policy_denied")
    if state.revoked:
        raise InvalidRequest("the delegation is already revoked", details={"delegation_id": state.delegation_id})
    event = _event(command, stamp, "delegation_revoked", {"delegation_id": state.delegation_id,
                                                          "reason": command.reason})
    return (Decision(event=event, head=None, result={"delegation_id": state.delegation_id, "revoked": True}),
            msgspec.structs.replace(state, revoked=True))


def _check(command: CheckDelegation, state: DelegationState, stamp: Stamp,
           authority: Authority) -> tuple[Decision, DelegationState]:
    grant = state.grant
    if command.actor.actor_id != command.delegated_actor_id and not authority.administers(command.actor.actor_id):
        raise _denied("delegation.actor_mismatch", "a delegation is checked by its delegated actor")
    if state.revoked:
        raise _denied("delegation.revoked", "the delegation was revoked")
    if command.delegated_actor_id != grant["delegated_actor"]["actor_id"]:
        raise _denied("delegation.actor_mismatch", "the delegation was granted to another actor")
    if command.on_behalf_of_actor_id not in (None, grant["granting_actor"]["actor_id"]):
        raise _denied("delegation.grantor_mismatch", "the delegation was granted by another actor")
    now = timestamp_text(stamp.now)
    if not grant["not_before"] <= now <= grant["not_after"]:
        raise _denied("delegation.outside_window", "the delegation is not in effect at this time")
    if command.operation not in grant["granted_operations"]:
        raise _denied("delegation.operation_not_granted", "the operation is not delegated")
    if command.whole_scope and ("granted_object_ids" in grant or "granted_object_types" in grant):
        raise _denied("delegation.object_not_granted", "the delegation covers some objects, not the whole scope")
    if command.object_id is not None and "granted_object_ids" in grant \
            and command.object_id not in grant["granted_object_ids"]:
        raise _denied("delegation.object_not_granted", "the object is not delegated")
    if "granted_object_types" in grant and (command.object_type not in grant["granted_object_types"]) \
            and (command.object_type is not None or command.strict):
        raise _denied("delegation.object_type_not_granted", "the object type is not delegated")
    if _grantor_lacks(authority, grant["granting_actor"]["actor_id"],
                      {state.scope_id, grant.get("target_scope_id", state.scope_id)}, [command.operation]):
        raise _denied("delegation.grantor_lacks_operation", "the grantor no longer holds the operation")
    limit = grant.get("usage_limit")
    if limit is not None and state.uses >= limit:
        raise _denied("delegation.usage_exhausted", "the delegation's uses are spent")
    uses = state.uses + 1
    payload: dict[str, Any] = {"delegation_id": state.delegation_id, "operation": command.operation, "use": uses}
    for name in ("object_id", "object_type"):
        if getattr(command, name) is not None:
            payload[name] = getattr(command, name)
    event = _event(command, stamp, "delegation_exercised", payload)
    result = {"delegation_id": state.delegation_id, "delegation": grant, "uses": uses,
              "uses_left": None if limit is None else limit - uses}
    return Decision(event=event, head=None, result=result), msgspec.structs.replace(state, uses=uses)




def exercise_for(command: ObjectCommand, head_meta: dict[str, Any] | None) -> CheckDelegation | None:
    """The use of a delegation a command makes when its actor names one (`actor.delegation_id`): checked and
    counted in the same batch, before the command, which is refused if the check is. The version's provenance
    must reference the delegation too (PAMSPEC 15.4: every exercise is traceable to its grant)."""
    actor = command.actor
    if actor.delegation_id is None:
        return None
    if command.provenance.actor is None or command.provenance.actor.delegation_id != actor.delegation_id:
        raise InvalidObject("a command made under a delegation names it in provenance.actor.delegation_id too",
                            details={"field": "/provenance/actor/delegation_id", "delegation_id": actor.delegation_id})
    strict = False
    object_type: str | None
    if isinstance(command, CreateObject):
        object_type, object_id = command.object_type, command.object_id
    elif isinstance(command, Promote):  # the object it makes of the working memory
        object_type, object_id = command.target_object_type, command.source_object_id
    elif isinstance(command, Relate) or is_relationship(head_meta or {}):
        # A relationship has no object type: a delegation restricted to types covers it only if it names
        # "relationship" among them (strict: never waved through for want of a type).
        object_type, strict = RELATIONSHIP_TYPE, True
        object_id = command.source_object_id if isinstance(command, Relate) else command.object_id
    else:
        object_type, object_id = (head_meta or {}).get("object_type"), command.object_id
    return CheckDelegation(scope_id=command.scope_id, delegation_id=actor.delegation_id,
                           delegated_actor_id=actor.actor_id, operation=operation_of(command),  # type: ignore[arg-type]
                           actor=actor, object_id=object_id, object_type=object_type, strict=strict,
                           on_behalf_of_actor_id=actor.on_behalf_of_actor_id)


def operation_of(command: ObjectCommand) -> str:
    """The PAMSPEC operation a command performs: an availability transition is a redaction (to redacted, or a
    restoration to available) or a deletion, whatever command carries it."""
    if isinstance(command, TransitionState) and command.dimension == "availability":
        return "delete" if command.target_state == "deleted" else "redact"
    return REQUEST_OPERATIONS[f"cmd.{type(command).__struct_config__.tag}"]
