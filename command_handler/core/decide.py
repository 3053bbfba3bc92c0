"""The writer's pure core: decide(head, command, stamp, registry, context) -> Decision, and evolve.

No clock, uuid, I/O or logging here: ids and time arrive in a Stamp, the object types, content schemas and
transition tables in a TypeRegistry, and what a command may look at besides its own object's head (the
other objects it names, the actors' grants, restorable content) in a Context. A rejection raises a
CommandRejected subclass carrying its stable PAMSPEC code. Relate, Redact and Promote live in their own
modules (relationships, redactions, promotion); this one dispatches and holds create, update, transition,
delete, provenance correction and tool memory.
"""

from __future__ import annotations

from typing import Any

import msgspec

from authz.policy import RETENTION_ACTOR_ID
from command_handler.core import imports, promotion, redactions, relationships
from command_handler.core.delegations import operation_of
from command_handler.core.tool_memory import TOOL_EVENTS, check_invocation, tool_entry
from command_handler.core.validation import carried_validation, check_validation
from command_handler.core.state import NO_CONTEXT, Context, Decision, ObjectHead, Stamp
from command_handler.core.versions import (
    check_actor,
    content_digest,
    entry_event,
    live_head,
    next_head,
    stamped,
    transition_payload,
    version_event,
    with_optionals,
)
from schemas.canonical import canonical_bytes
from schemas.commands import (
    CloseSubscription,
    CorrectProvenance,
    CreateObject,
    DeleteObject,
    EventOnlyCommand,
    ImportEntries,
    ObjectCommand,
    OpenSubscription,
    Promote,
    RecordAccessDenied,
    RecordIndexEvent,
    RegisterEmbeddingSpace,
    TransitionState,
    UpdateObject,
)
from schemas.common import SPEC_VERSION, SYSTEM_SCOPE
from schemas.embedding import space_digest
from schemas.errors import (
    AccessDenied,
    InvalidObject,
    InvalidRequest,
    InvalidStateTransition,
    ObjectRedacted,
    PamledgerError,
    VersionConflict,
)
from schemas.events import TRANSITION_EVENT
from schemas.redaction import Redact
from schemas.registry import TypeRegistry
from schemas.relationship import Relate, is_relationship

__all__ = ["decide", "content_digest"]  # tests and benches name them so


def decide(
    head: ObjectHead | None, command: ObjectCommand | EventOnlyCommand | ImportEntries, stamp: Stamp,
    registry: TypeRegistry, context: Context = NO_CONTEXT,
) -> Decision:
    """Validate one command against the object's head, the registry's tables and the context, and say what it
    writes, or raise."""
    if isinstance(command, ImportEntries):  # a bundle's entries, replayed as they were (core.imports)
        return imports.import_chunk(command, stamp, context)
    if isinstance(command, (OpenSubscription, CloseSubscription, RegisterEmbeddingSpace, RecordIndexEvent,
                            RecordAccessDenied)):  # schemas.commands.EventOnlyCommand
        return _event_only(command, stamp)
    if command.actor.actor_id == RETENTION_ACTOR_ID and not _expiration(command, head):
        raise AccessDenied("the retention evaluator's actor only moves retention from retained to expired",
                           rule_id="retention.actor_expires_only")
    policy = context.scope_policies.get(command.scope_id)
    match command:
        case CreateObject():
            check_validation(command, head, context.authority, policy)
            return create(head, command, stamp, registry, context)
        case UpdateObject():
            current = _object_head(head, command)
            return _update(current, command, stamp, registry,
                           carried_validation(command, current, context.authority, policy))
        case TransitionState():
            current = live_head(head, command.object_id, command.expected_version_id)
            check_validation(command, current, context.authority, policy)
            return _transition(current, command, stamp, registry, context)
        case DeleteObject():
            return redactions.erase(live_head(head, command.object_id, command.expected_version_id), command, stamp,
                                    "deleted", "object_deleted", context)
        case CorrectProvenance():
            return _correct_provenance(live_head(head, command.object_id, command.expected_version_id), command, stamp)
        case Relate():
            return relationships.relate(head, command, stamp, context)
        case Redact():
            return redactions.redact(live_head(head, command.object_id, command.expected_version_id), command, stamp,
                                     context)
        case Promote():
            check_validation(command, head, context.authority, policy)
            return promotion.promote(head, command, stamp, registry, context, create)
    raise InvalidRequest(f"unknown command {type(command).__name__}")


def _expiration(command: Any, head: ObjectHead | None) -> bool:
    """A transition of retention from retained to expired: all the retention evaluator's actor may ever write
    (never a hold's release)."""
    return isinstance(command, TransitionState) and (command.dimension, command.target_state) == ("retention", "expired") \
        and head is not None and head.state("retention") == "retained"


def _event_only(command: EventOnlyCommand, stamp: Stamp) -> Decision:
    """A ledger entry without a Memory Version. Its `sequence` is set to its ledger sequence on append."""
    payload: dict[str, Any]
    if isinstance(command, OpenSubscription):
        event_type, payload = "subscription_opened", {"subscription": command.subscription}
    elif isinstance(command, CloseSubscription):
        event_type = "subscription_closed"
        payload = {"subscription_id": command.subscription_id, "reason": command.reason,
                   "last_delivered_sequence": command.last_delivered_sequence}
    elif isinstance(command, RegisterEmbeddingSpace):
        if command.scope_id != SYSTEM_SCOPE:
            raise InvalidRequest("embedding spaces are registered in the system scope",
                                 details={"scope_id": command.scope_id, "expected": SYSTEM_SCOPE})
        event_type = "index_rebuilt"
        payload = {"action": "space_registered", "embedding_space": msgspec.to_builtins(command.space),
                   "space_digest": space_digest(command.space)}
    elif isinstance(command, RecordAccessDenied):
        if command.scope_id != SYSTEM_SCOPE:
            raise InvalidRequest("denials are recorded in the system scope",
                                 details={"scope_id": command.scope_id, "expected": SYSTEM_SCOPE})
        event_type, payload = "access_denied", msgspec.to_builtins(command.denial)
    else:
        event_type, payload = command.event_type, command.payload
    return Decision(event=entry_event(command.actor, stamp, command.scope_id, event_type, payload), head=None)


def _object_head(head: ObjectHead | None, command: UpdateObject) -> ObjectHead:
    head = live_head(head, command.object_id, command.expected_version_id)
    if is_relationship(head.meta):
        raise InvalidRequest("this id names a Relationship Object: its next version is written with relate",
                             details={"relationship_id": head.object_id})
    return head


def _check_type(command: CreateObject, registry: TypeRegistry) -> None:
    object_type = command.object_type
    if object_type in registry.object_types:
        return
    if not registry.is_extension_type(object_type):
        raise PamledgerError(
            "object_type is neither a standard type nor a reverse-DNS or URI extension type",
            details={"object_type": object_type, "standard_types": sorted(registry.object_types)},
            code="unsupported_object_type",
        )
    if command.schema_id is None:
        raise InvalidObject("extension object types require schema_id", details={"object_type": object_type})


def create(head: ObjectHead | None, command: CreateObject, stamp: Stamp, registry: TypeRegistry,
           context: Context = NO_CONTEXT) -> Decision:
    if head is not None:
        raise VersionConflict(
            "an object with this object_id already exists in this scope",
            details={"object_id": head.object_id, "current_version_id": head.version_id},
        )
    _check_type(command, registry)
    check_actor(command.actor, command.provenance)
    registry.check_content(command.object_type, command.canonical_content)
    if command.object_type == "tool_result":
        check_invocation(command, context)
    if command.availability_state != "available":
        raise InvalidRequest("objects are created available", details={"availability_state": command.availability_state})
    lifecycle = command.lifecycle_state or registry.lifecycle_at_creation(command.object_type)
    meta: dict[str, Any] = {
        "spec_version": SPEC_VERSION,
        "object_id": stamp.object_id,
        "scope_id": command.scope_id,
        "object_type": command.object_type,
        "lifecycle_state": lifecycle,
        "availability_state": command.availability_state,
        "retention_state": command.retention_state,
        "validation_state": command.validation_state,
    }
    if command.schema_id is not None:
        meta["schema_id"] = command.schema_id
    stamped(with_optionals(meta, command), command.actor, command.provenance, stamp, 1)
    content = canonical_bytes(command.canonical_content)
    new = ObjectHead(
        scope_id=command.scope_id, object_id=stamp.object_id, version_id=stamp.version_id,
        sequence=1, meta=meta, content_digest=content_digest(stamp.salt, content),
    )
    decision = Decision(event=version_event(command.actor, stamp, "object_created", new, {}), head=new, content=content)
    tool_event = TOOL_EVENTS.get(command.object_type)
    if tool_event is None:
        return decision
    return msgspec.structs.replace(decision, followers=(tool_entry(command, stamp, tool_event, new),))


def _update(head: ObjectHead, command: UpdateObject, stamp: Stamp, registry: TypeRegistry,
            validation: str | None = None) -> Decision:
    """A new version with new content; `validation`: the state it carries instead of its head's (core.validation:
    new words are unverified again where the updating actor could not have set the head's state)."""
    if head.state("availability") in ("redacted", "partially_redacted"):
        raise ObjectRedacted("object content is redacted; it cannot be updated", details={"object_id": head.object_id})
    check_actor(command.actor, command.provenance)
    registry.check_content(str(head.meta["object_type"]), command.canonical_content)
    meta = stamped(with_optionals(dict(head.meta), command), command.actor, command.provenance, stamp,
                   head.sequence + 1)
    if validation is not None:
        meta["validation_state"] = validation
    content = canonical_bytes(command.canonical_content)
    new = next_head(head, stamp, meta, content_digest(stamp.salt, content))
    payload = {"previous_version_id": head.version_id}
    return Decision(event=version_event(command.actor, stamp, "object_updated", new, payload), head=new, content=content)


def _transition(head: ObjectHead, command: TransitionState, stamp: Stamp, registry: TypeRegistry,
                context: Context) -> Decision:
    dimension, target = command.dimension, command.target_state
    current = head.state(dimension)
    details: dict[str, Any] = {"object_id": head.object_id, "dimension": dimension, "from": current, "to": target}
    if target not in registry.states[dimension]:
        raise InvalidStateTransition(f"{target!r} is not a {dimension} state", details=details)
    check_transition(registry, context, command, current, details)
    check_actor(command.actor, command.provenance)
    if dimension == "availability" and command.actor.delegation_id is None:
        # Erasing, deleting or restoring content is what `redact` and `delete` grant, whichever command asks.
        operation = operation_of(command)
        if not context.authority.holds(command.actor.actor_id, head.scope_id, operation):
            raise AccessDenied(f"an availability transition to {target} needs the {operation} operation",
                               rule_id=f"transition.availability_needs_{operation}")
    if dimension == "availability":
        return redactions.availability(head, command, stamp, context)
    meta = stamped(dict(head.meta), command.actor, command.provenance, stamp, head.sequence + 1)
    meta[f"{dimension}_state"] = target
    new = next_head(head, stamp, meta, head.content_digest)
    payload = transition_payload(head, dimension, current, target, command.policy_basis)
    if command.policy_override:
        payload["policy_override"] = True
    return Decision(event=version_event(command.actor, stamp, TRANSITION_EVENT[dimension], new, payload), head=new)


def check_transition(registry: TypeRegistry, context: Context, command: TransitionState, current: str,
                     details: dict[str, Any]) -> None:
    """The 9.5 tables with their qualifications: a plain move passes; a qualified one ("with review policy")
    needs a policy_basis (policy_denied); a move of the "forbidden without policy override" column needs
    policy_override (else invalid_state_transition), a policy_basis (policy_denied) and an administrator
    (access_denied, rule transition.override_needs_administrator); any other move is invalid_state_transition."""
    rule, policy = registry.transition_rule(command.dimension, current, command.target_state)
    if rule == "forbidden":
        details["allowed"] = list(registry.allowed_targets(command.dimension, current))
        raise InvalidStateTransition(f"{command.dimension} cannot move from {current} to {command.target_state}",
                                     details=details)
    if policy is not None:
        details["needs"] = policy
    if rule == "needs_override" and not command.policy_override:
        raise InvalidStateTransition(
            f"{command.dimension} {current} -> {command.target_state} is forbidden without a policy override"
            f" ({policy}): send policy_override with a policy_basis", details=details)
    if rule != "allowed" and not command.policy_basis:
        raise PamledgerError(f"{command.dimension} {current} -> {command.target_state} needs a policy_basis ({policy})",
                             details=details, code="policy_denied")
    if rule == "needs_override" and not context.authority.administers(command.actor.actor_id):
        raise AccessDenied("a policy override is an administrator's", rule_id="transition.override_needs_administrator")


def _correct_provenance(head: ObjectHead, command: CorrectProvenance, stamp: Stamp) -> Decision:
    """A new version with the corrected provenance; fields it drops must be named (never silently removed)."""
    check_actor(command.actor, command.provenance)
    previous: dict[str, Any] = head.meta["provenance"]
    corrected = msgspec.to_builtins(command.provenance)
    dropped = sorted(set(previous) - set(corrected) - {"recorded_at"})
    unnamed = [name for name in dropped if name not in (command.removed_fields or [])]
    if unnamed:
        raise InvalidRequest("provenance cannot be silently removed: name every field the correction drops in"
                             " removed_fields", details={"object_id": head.object_id, "dropped_fields": unnamed})
    meta = stamped(dict(head.meta), command.actor, command.provenance, stamp, head.sequence + 1)
    new = next_head(head, stamp, meta, head.content_digest)
    payload: dict[str, Any] = {"previous_version_id": head.version_id,
                               "previous_provenance_id": previous.get("provenance_id")}
    if dropped:
        payload["removed_fields"] = dropped
    if command.policy_basis is not None:
        payload["policy_basis"] = command.policy_basis
    return Decision(event=version_event(command.actor, stamp, "provenance_updated", new, payload), head=new)
