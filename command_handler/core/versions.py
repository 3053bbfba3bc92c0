"""What every operation of the writer's core does to write a version: pure helpers shared by core.py and the
operation modules (relationships, redactions, promotion). No I/O, no clock: time and ids come in a Stamp.
"""

from __future__ import annotations

import hashlib
from typing import Any

import msgspec

from command_handler.core.state import ObjectHead, Stamp
from schemas.canonical import salted_digest
from schemas.envelope import Actor, Provenance
from schemas.evaluation import run_evidence
from schemas.errors import ObjectDeleted, ObjectNotFound, PamledgerError, VersionConflict
from schemas.events import Event, event_of
from schemas.relationship import is_relationship

TOMBSTONE_CONTENT = {"tombstone": True}
OPTIONAL_FIELDS = (
    "observed_at", "asserted_at", "valid_from", "valid_until",
    "relationship_refs", "integrity", "quality_signals",
)


content_digest = salted_digest  # the salted digest the ledger keeps (schemas.canonical)


def live_head(head: ObjectHead | None, object_id: str, expected_version_id: str | None) -> ObjectHead:
    """The head a command acts on: present, not deleted, and the version the command expects."""
    if head is None:
        raise ObjectNotFound("object not found in this scope", details={"object_id": object_id})
    if head.deleted:
        raise ObjectDeleted(
            "object has been deleted", details={"object_id": head.object_id, "tombstone_version_id": head.version_id}
        )
    if expected_version_id != head.version_id:
        raise VersionConflict(
            "expected version is stale" if expected_version_id else "expected_version_id is required here",
            details={"object_id": head.object_id, "expected_version_id": expected_version_id,
                     "current_version_id": head.version_id},
        )
    return head


def check_actor(actor: Actor, provenance: Provenance) -> None:
    for who in (actor, provenance.actor):
        att = who.attestation
        if att and att.not_before and att.not_after and att.not_before > att.not_after:
            raise PamledgerError(
                "actor attestation window is inverted (not_before after not_after)",
                details={"actor_id": who.actor_id},
                code="policy_denied",
            )


def stamped(meta: dict[str, Any], actor: Actor, provenance: Provenance, stamp: Stamp, sequence: int) -> dict[str, Any]:
    """Service-assigned fields (version, sequence, times) plus the command's actor and provenance."""
    now = msgspec.to_builtins(stamp.now)
    recorded = msgspec.to_builtins(provenance)
    recorded.setdefault("recorded_at", now)
    if stamp.evaluation_run_id is not None:  # the run, where provenance.schema.json leaves room for it
        evidence = run_evidence(stamp.evaluation_run_id)
        refs = recorded.get("evidence_refs") or []
        recorded["evidence_refs"] = refs if evidence in refs else [*refs, evidence]
    meta.update(
        version_id=stamp.version_id,
        sequence=sequence,
        committed_at=now,
        recorded_at=now,
        actor=msgspec.to_builtins(actor),
        provenance=recorded,
    )
    return meta


def with_optionals(meta: dict[str, Any], command: Any, names: tuple[str, ...] = OPTIONAL_FIELDS) -> dict[str, Any]:
    for name in names:
        value = getattr(command, name, None)
        if value is not None:
            meta[name] = msgspec.to_builtins(value)
    return meta


def next_head(head: ObjectHead, stamp: Stamp, meta: dict[str, Any], digest: str | None) -> ObjectHead:
    """The version after `head`: same object, the stamp's version id, the next sequence."""
    return ObjectHead(scope_id=head.scope_id, object_id=head.object_id, version_id=stamp.version_id,
                      sequence=head.sequence + 1, meta=meta, content_digest=digest)


def version_event(actor: Actor, stamp: Stamp, event_type: str, head: ObjectHead, payload: dict[str, Any]) -> Event:
    """The ledger entry committing `head` (a Relationship Version names relationship_id, not object_id)."""
    relationship = is_relationship(head.meta)
    return event_of(  # type: ignore[no-any-return]
        event_type, in_run({"envelope": head.meta, "content_digest": head.content_digest, **payload}, stamp),
        event_id=stamp.event_id, operation_id=stamp.operation_id, scope_id=head.scope_id,
        object_id=None if relationship else head.object_id, relationship_id=head.object_id if relationship else None,
        version_id=head.version_id, recorded_at=stamp.now, sequence=head.sequence, actor=actor)


def entry_event(actor: Actor, stamp: Stamp, scope_id: str, event_type: str, payload: dict[str, Any],
                object_id: str | None = None) -> Event:
    """An event-only entry (no Memory Version); the planner sets its `sequence` to its ledger sequence."""
    return event_of(event_type, in_run(payload, stamp), event_id=stamp.event_id,  # type: ignore[no-any-return]
                    operation_id=stamp.operation_id, scope_id=scope_id, recorded_at=stamp.now, sequence=1,
                    actor=actor, object_id=object_id)


def in_run(payload: dict[str, Any], stamp: Stamp) -> dict[str, Any]:
    """An entry's payload with the evaluation run that writes it, if any."""
    return payload if stamp.evaluation_run_id is None else {**payload, "evaluation_run_id": stamp.evaluation_run_id}


def follower_stamp(stamp: Stamp, index: int, prefix: str = "mem") -> Stamp:
    """The ids of a command's `index`-th further entry (1, 2, ...), from the stamp's spare uuids: its own
    event, version and object ids (object id `<prefix>:<uuid>`) and a salt of its own, so two contents
    written by one command never share a digest."""
    base = 3 * (index - 1)
    if len(stamp.spare) < base + 3:
        raise PamledgerError("the command was not stamped with enough ids for its entries")
    return msgspec.structs.replace(
        stamp, event_id=f"evt:{stamp.spare[base]}", version_id=f"ver:{stamp.spare[base + 1]}",
        object_id=f"{prefix}:{stamp.spare[base + 2]}", salt=hashlib.sha256(stamp.salt + bytes([index])).digest()[:16],
        spare=(),
    )


def transition_payload(head: ObjectHead, dimension: str, current: str, target: str,
                       policy_basis: str | None) -> dict[str, Any]:
    payload: dict[str, Any] = {"dimension": dimension, "from": current, "to": target,
                               "previous_version_id": head.version_id}
    if policy_basis is not None:
        payload["policy_basis"] = policy_basis
    return payload
