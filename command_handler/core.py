"""The writer's pure core: decide(state, command) -> Decision and evolve(state, decision) -> state.

No clock, uuid, I/O or logging here: ids and time arrive in a Stamp, and the object types, content schemas
and transition tables in a TypeRegistry. A rejection raises a CommandRejected subclass carrying its stable
PAMSPEC code.
"""

from __future__ import annotations

import hashlib
from typing import Any

import msgspec

from command_handler.state import Decision, ObjectHead, Stamp
from schemas.canonical import canonical_bytes
from schemas.commands import (
    CloseSubscription,
    CreateObject,
    DeleteObject,
    EventOnlyCommand,
    ObjectCommand,
    OpenSubscription,
    RecordAccessDenied,
    RecordIndexEvent,
    RegisterEmbeddingSpace,
    TransitionState,
    UpdateObject,
)
from schemas.common import SPEC_VERSION, SYSTEM_SCOPE
from schemas.embedding import space_digest
from schemas.envelope import Actor, Provenance
from schemas.errors import (
    InvalidObject,
    InvalidRequest,
    InvalidStateTransition,
    LegalHold,
    ObjectDeleted,
    ObjectNotFound,
    ObjectRedacted,
    VersionConflict,
)
from schemas.events import TRANSITION_EVENT, LedgerEvent
from schemas.errors import PamledgerError
from schemas.registry import TypeRegistry

TOMBSTONE_CONTENT = {"tombstone": True}
_OPTIONAL_FIELDS = (
    "observed_at", "asserted_at", "valid_from", "valid_until",
    "relationship_refs", "integrity", "quality_signals",
)


def decide(
    head: ObjectHead | None, command: ObjectCommand | EventOnlyCommand, stamp: Stamp, registry: TypeRegistry
) -> Decision:
    """Validate one command against the object's head and the registry's tables and say what it writes, or
    raise."""
    match command:
        case OpenSubscription() | CloseSubscription() | RegisterEmbeddingSpace() | RecordIndexEvent() | RecordAccessDenied():
            return _event_only(command, stamp)
        case CreateObject():
            return _create(head, command, stamp, registry)
        case UpdateObject():
            return _update(_live_head(head, command), command, stamp, registry)
        case TransitionState():
            return _transition(_live_head(head, command), command, stamp, registry)
        case DeleteObject():
            return _delete(_live_head(head, command), command, stamp)
    raise InvalidRequest(f"unknown command {type(command).__name__}")


def evolve(head: ObjectHead | None, decision: Decision) -> ObjectHead | None:
    """The object's head after a decision commits."""
    return decision.head if decision.head is not None else head


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
    event = LedgerEvent(
        event_id=stamp.event_id, operation_id=stamp.operation_id, scope_id=command.scope_id,
        event_type=event_type,  # type: ignore[arg-type]
        recorded_at=stamp.now, sequence=1, actor=command.actor, payload=payload,
    )
    return Decision(event=event, head=None)


def content_digest(salt: bytes, content: bytes) -> str:
    """Salted digest: the ledger keeps it, and once salt and content are erased it reveals nothing."""
    return "sha256:" + hashlib.sha256(salt + content).hexdigest()


def _live_head(head: ObjectHead | None, command: UpdateObject | TransitionState | DeleteObject) -> ObjectHead:
    if head is None:
        raise ObjectNotFound("object not found in this scope", details={"object_id": command.object_id})
    if head.deleted:
        raise ObjectDeleted(
            "object has been deleted", details={"object_id": head.object_id, "tombstone_version_id": head.version_id}
        )
    if command.expected_version_id != head.version_id:
        raise VersionConflict(
            "expected version is stale",
            details={
                "object_id": head.object_id,
                "expected_version_id": command.expected_version_id,
                "current_version_id": head.version_id,
            },
        )
    return head


def _check_actor(actor: Actor, provenance: Provenance) -> None:
    for who in (actor, provenance.actor):
        att = who.attestation
        if att and att.not_before and att.not_after and att.not_before > att.not_after:
            raise PamledgerError(
                "actor attestation window is inverted (not_before after not_after)",
                details={"actor_id": who.actor_id},
                code="policy_denied",
            )


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


def _stamped(meta: dict[str, Any], command: Any, stamp: Stamp, sequence: int) -> dict[str, Any]:
    """Service-assigned fields (version, sequence, times) plus the command's actor and provenance."""
    now = msgspec.to_builtins(stamp.now)
    provenance = msgspec.to_builtins(command.provenance)
    provenance.setdefault("recorded_at", now)
    meta.update(
        version_id=stamp.version_id,
        sequence=sequence,
        committed_at=now,
        recorded_at=now,
        actor=msgspec.to_builtins(command.actor),
        provenance=provenance,
    )
    return meta


def _with_optionals(meta: dict[str, Any], command: CreateObject | UpdateObject) -> dict[str, Any]:
    for name in _OPTIONAL_FIELDS:
        value = getattr(command, name)
        if value is not None:
            meta[name] = msgspec.to_builtins(value)
    return meta


def _event(command: Any, stamp: Stamp, event_type: str, head: ObjectHead, payload: dict[str, Any]) -> LedgerEvent:
    return LedgerEvent(
        event_id=stamp.event_id,
        operation_id=stamp.operation_id,
        scope_id=head.scope_id,
        object_id=head.object_id,
        version_id=head.version_id,
        event_type=event_type,  # type: ignore[arg-type]
        recorded_at=stamp.now,
        sequence=head.sequence,
        actor=command.actor,
        payload={"envelope": head.meta, "content_digest": head.content_digest, **payload},
    )


def _create(head: ObjectHead | None, command: CreateObject, stamp: Stamp, registry: TypeRegistry) -> Decision:
    if head is not None:
        raise VersionConflict(
            "an object with this object_id already exists in this scope",
            details={"object_id": head.object_id, "current_version_id": head.version_id},
        )
    _check_type(command, registry)
    _check_actor(command.actor, command.provenance)
    registry.check_content(command.object_type, command.canonical_content)
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
    _stamped(_with_optionals(meta, command), command, stamp, 1)
    content = canonical_bytes(command.canonical_content)
    new = ObjectHead(
        scope_id=command.scope_id, object_id=stamp.object_id, version_id=stamp.version_id,
        sequence=1, meta=meta, content_digest=content_digest(stamp.salt, content),
    )
    return Decision(event=_event(command, stamp, "object_created", new, {}), head=new, content=content)


def _update(head: ObjectHead, command: UpdateObject, stamp: Stamp, registry: TypeRegistry) -> Decision:
    if head.state("availability") in ("redacted", "partially_redacted"):
        raise ObjectRedacted("object content is redacted; it cannot be updated", details={"object_id": head.object_id})
    _check_actor(command.actor, command.provenance)
    registry.check_content(str(head.meta["object_type"]), command.canonical_content)
    meta = _stamped(_with_optionals(dict(head.meta), command), command, stamp, head.sequence + 1)
    content = canonical_bytes(command.canonical_content)
    new = ObjectHead(
        scope_id=head.scope_id, object_id=head.object_id, version_id=stamp.version_id,
        sequence=head.sequence + 1, meta=meta, content_digest=content_digest(stamp.salt, content),
    )
    payload = {"previous_version_id": head.version_id}
    return Decision(event=_event(command, stamp, "object_updated", new, payload), head=new, content=content)


def _transition(head: ObjectHead, command: TransitionState, stamp: Stamp, registry: TypeRegistry) -> Decision:
    dimension, target = command.dimension, command.target_state
    current = head.state(dimension)
    details: dict[str, Any] = {"object_id": head.object_id, "dimension": dimension, "from": current, "to": target}
    if target not in registry.states[dimension]:
        raise InvalidStateTransition(f"{target!r} is not a {dimension} state", details=details)
    allowed = registry.allowed_targets(dimension, current)
    if target not in allowed:
        details["allowed"] = list(allowed)
        raise InvalidStateTransition(f"{dimension} cannot move from {current} to {target}", details=details)
    _check_actor(command.actor, command.provenance)
    if dimension == "availability":
        return _availability(head, command, stamp, target)
    meta = _stamped(dict(head.meta), command, stamp, head.sequence + 1)
    meta[f"{dimension}_state"] = target
    new = ObjectHead(
        scope_id=head.scope_id, object_id=head.object_id, version_id=stamp.version_id,
        sequence=head.sequence + 1, meta=meta, content_digest=head.content_digest,
    )
    payload = _transition_payload(head, command, current)
    return Decision(event=_event(command, stamp, TRANSITION_EVENT[dimension], new, payload), head=new)


def _transition_payload(head: ObjectHead, command: Any, current: str) -> dict[str, Any]:
    payload: dict[str, Any] = {
        "dimension": getattr(command, "dimension", "availability"),
        "from": current,
        "to": getattr(command, "target_state", "deleted"),
        "previous_version_id": head.version_id,
    }
    if command.policy_basis is not None:
        payload["policy_basis"] = command.policy_basis
    return payload


def _availability(head: ObjectHead, command: TransitionState, stamp: Stamp, target: str) -> Decision:
    if target == "deleted":
        return _delete(head, command, stamp)
    if target == "redacted":
        return _erase(head, command, stamp, "redacted", "availability_transitioned")
    raise InvalidRequest(
        f"availability {target} needs the redact operation with a redaction target, which this release lacks",
        details={"object_id": head.object_id, "dimension": "availability", "to": target},
    )


def _delete(head: ObjectHead, command: DeleteObject | TransitionState, stamp: Stamp) -> Decision:
    return _erase(head, command, stamp, "deleted", "object_deleted")


def _erase(head: ObjectHead, command: Any, stamp: Stamp, availability: str, event_type: str) -> Decision:
    """A content-free version (tombstone); the content of every version of the object is erased."""
    if head.state("retention") == "legal_hold":
        raise LegalHold(
            "retention legal_hold blocks deletion and redaction", details={"object_id": head.object_id}
        )
    meta = _stamped(dict(head.meta), command, stamp, head.sequence + 1)
    meta["availability_state"] = availability
    new = ObjectHead(
        scope_id=head.scope_id, object_id=head.object_id, version_id=stamp.version_id,
        sequence=head.sequence + 1, meta=meta, content_digest=None,
    )
    payload = _transition_payload(head, command, head.state("availability"))
    payload["dimension"] = "availability"
    payload["to"] = availability
    event = _event(command, stamp, event_type, new, payload)
    return Decision(event=event, head=new, erase_content=True)
