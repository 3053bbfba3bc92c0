"""Relate (PAMSPEC 8.5, 10.5): create a Relationship Object or write its next version. Pure.

Rules, in order: the relationship_type is a vocabulary label or a reverse-DNS/URI name (invalid_request); a
target in another scope needs a policy_basis (policy_denied) and its scope must be one the actor may read
(access_denied, rule relate.target_scope_not_granted); both endpoints are live Memory Objects (object_not_found
without telling another scope's objects apart from missing ones, object_deleted, invalid_request for a
relationship as endpoint); no self-loop by a vocabulary type (invalid_request). An update names the existing
relationship with its expected version, keeps its endpoints (relationship_conflict otherwise; a deleted
endpoint does not stop it: the relationship is governed on its own) and its states (invalid_request: states
move with transition). Neither endpoint gets a new version.
"""

from __future__ import annotations

from typing import Any

from command_handler.core.state import Context, Decision, ObjectHead, Stamp
from command_handler.core.versions import check_actor, content_digest, live_head, stamped, version_event, with_optionals
from schemas.canonical import canonical_bytes
from schemas.common import SPEC_VERSION
from schemas.errors import (
    AccessDenied,
    InvalidRequest,
    ObjectDeleted,
    ObjectNotFound,
    ObjectRedacted,
    PamledgerError,
    VersionConflict,
)
from schemas.relationship import INITIAL_STATES, Relate, is_relationship, relationship_type_problem, self_loop_allowed

_TEMPORAL = ("observed_at", "asserted_at", "valid_from", "valid_until", "integrity")
_DIMENSIONS = ("lifecycle", "availability", "retention", "validation")


def relate(head: ObjectHead | None, command: Relate, stamp: Stamp, context: Context) -> Decision:
    problem = relationship_type_problem(command.relationship_type)
    if problem is not None:
        raise InvalidRequest(problem, details={"relationship_type": command.relationship_type})
    target_scope = _target_scope(command, context)
    if head is not None:  # an update: its endpoints are fixed, and gone ones leave it governed on its own
        check_actor(command.actor, command.provenance)
        return _update(head, command, stamp, target_scope)
    if command.expected_version_id is not None:
        raise ObjectNotFound("relationship not found in this scope", details={"relationship_id": stamp.object_id})
    _endpoint(context, command.scope_id, command.source_object_id, "source")
    _endpoint(context, target_scope, command.target_object_id, "target")
    if (command.source_object_id, command.scope_id) == (command.target_object_id, target_scope) \
            and not self_loop_allowed(command.relationship_type):
        raise InvalidRequest(f"an object cannot be related to itself by {command.relationship_type}",
                             details={"object_id": command.source_object_id,
                                      "relationship_type": command.relationship_type})
    check_actor(command.actor, command.provenance)
    return create_relationship(command, stamp, target_scope)


def relationship_meta(command: Relate, stamp: Stamp, target_scope: str, states: dict[str, str],
                      sequence: int) -> dict[str, Any]:
    """A Relationship Version's envelope metadata (relationship.schema.json, canonical_content apart)."""
    meta: dict[str, Any] = {
        "spec_version": SPEC_VERSION,
        "relationship_id": stamp.object_id,
        "scope_id": command.scope_id,
        "relationship_type": command.relationship_type,
        "source_object_id": command.source_object_id,
        "target_object_id": command.target_object_id,
        "directionality": command.directionality,
        **{f"{dimension}_state": states[dimension] for dimension in _DIMENSIONS},
    }
    if target_scope != command.scope_id:
        meta["target_scope_id"] = target_scope
    if command.policy_basis is not None:
        meta["policy_basis"] = command.policy_basis
    return stamped(with_optionals(meta, command, _TEMPORAL), command.actor, command.provenance, stamp, sequence)


def create_relationship(command: Relate, stamp: Stamp, target_scope: str) -> Decision:
    """A new Relationship Object's first version (its endpoints already checked); its content is salted with
    the stamp's own salt (a follower's when promote makes it)."""
    states = {dimension: getattr(command, f"{dimension}_state") or INITIAL_STATES[dimension]
              for dimension in _DIMENSIONS}
    if states["availability"] != "available":
        raise InvalidRequest("relationships are created available", details={"availability_state": states["availability"]})
    meta = relationship_meta(command, stamp, target_scope, states, 1)
    content = canonical_bytes(command.canonical_content)
    new = ObjectHead(scope_id=command.scope_id, object_id=stamp.object_id, version_id=stamp.version_id, sequence=1,
                     meta=meta, content_digest=content_digest(stamp.salt, content))
    return Decision(event=version_event(command.actor, stamp, "relationship_created", new, {}), head=new, content=content,
                    salt=stamp.salt)


def _update(head: ObjectHead, command: Relate, stamp: Stamp, target_scope: str) -> Decision:
    if not is_relationship(head.meta):
        raise PamledgerError("this id names a Memory Object, not a relationship", code="relationship_conflict",
                             details={"relationship_id": head.object_id})
    if command.expected_version_id is None:
        raise VersionConflict("the relationship exists: an update needs its expected_version_id",
                              details={"relationship_id": head.object_id, "current_version_id": head.version_id})
    head = live_head(head, head.object_id, command.expected_version_id)
    endpoints = (head.meta["source_object_id"], head.meta["target_object_id"],
                 head.meta.get("target_scope_id", head.scope_id))
    if endpoints != (command.source_object_id, command.target_object_id, target_scope):
        raise PamledgerError("a relationship's endpoints are fixed: relate them anew", code="relationship_conflict",
                             details={"relationship_id": head.object_id, "source_object_id": endpoints[0],
                                      "target_object_id": endpoints[1], "target_scope_id": endpoints[2]})
    if head.state("availability") in ("redacted", "partially_redacted"):
        raise ObjectRedacted("the relationship's content is redacted", details={"relationship_id": head.object_id})
    states = {dimension: head.state(dimension) for dimension in _DIMENSIONS}
    for dimension in _DIMENSIONS:
        asked = getattr(command, f"{dimension}_state")
        if asked is not None and asked != states[dimension]:
            raise InvalidRequest(f"relate does not change {dimension}_state: use transition",
                                 details={"relationship_id": head.object_id, "dimension": dimension,
                                          "current": states[dimension], "asked": asked})
    meta = relationship_meta(command, stamp, target_scope, states, head.sequence + 1)
    content = canonical_bytes(command.canonical_content)
    new = ObjectHead(scope_id=head.scope_id, object_id=head.object_id, version_id=stamp.version_id,
                     sequence=head.sequence + 1, meta=meta, content_digest=content_digest(stamp.salt, content))
    payload = {"previous_version_id": head.version_id}
    return Decision(event=version_event(command.actor, stamp, "relationship_updated", new, payload), head=new,
                    content=content)


def _target_scope(command: Relate, context: Context) -> str:
    target_scope = command.target_scope_id or command.scope_id
    if target_scope == command.scope_id:
        return target_scope
    if not command.policy_basis:
        raise PamledgerError("a relationship to another scope needs an explicit policy_basis", code="policy_denied",
                             details={"scope_id": command.scope_id, "target_scope_id": target_scope})
    if not context.authority.holds(command.actor.actor_id, target_scope, "read"):
        raise AccessDenied("the actor may not read the target's scope", rule_id="relate.target_scope_not_granted")
    return target_scope


def _endpoint(context: Context, scope_id: str, object_id: str, role: str) -> ObjectHead:
    head = context.head(scope_id, object_id)
    if head is None:
        raise ObjectNotFound(f"the relationship's {role} object is not found in its scope",
                             details={f"{role}_object_id": object_id})
    if head.deleted:
        raise ObjectDeleted(f"the relationship's {role} object has been deleted",
                            details={f"{role}_object_id": object_id, "tombstone_version_id": head.version_id})
    if is_relationship(head.meta):
        raise InvalidRequest(f"the relationship's {role} is a relationship: endpoints are Memory Objects",
                             details={f"{role}_object_id": object_id})
    return head
