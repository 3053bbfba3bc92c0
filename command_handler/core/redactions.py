"""Redact, delete and restore (PAMSPEC 9.6, 10.9, 10.11): the availability dimension's moves. Pure.

- Delete writes the final tombstone version and erases the content of every version.
- Redact with no pointers: availability `redacted`, a content-free version. With `erase` (the default) the
  content of every version is erased for good; without it, it is suppressed: content storage keeps it and
  a restoration can bring it back.
- Redact with JSON Pointers: availability `partially_redacted`, a new version whose content is the permitted
  projection (each pointed-at value replaced by the marker); with `erase` every earlier version's content
  is erased, the projection alone is kept.
- Restoration (redacted or partially_redacted -> available, with a restoration policy basis) writes a
  version carrying the last suppressed content again; where it was erased, invalid_state_transition.
- `legal_hold` blocks delete and every erasing redaction (legal_hold); a suppression is compatible with it.
- A scope whose policy says `{"retention": {"minimum_days": N}}` keeps content at least N days from the
  object's creation: deleting or erasing it sooner is retention_restriction (suppression stays possible).
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from command_handler.core.state import Context, Decision, ObjectHead, Stamp
from command_handler.core.versions import (
    check_actor,
    content_digest,
    next_head,
    stamped,
    transition_payload,
    version_event,
)
from schemas.canonical import canonical_bytes, decode_json
from schemas.common import timestamp_text
from schemas.commands import DeleteObject, TransitionState
from schemas.errors import InvalidRequest, InvalidStateTransition, LegalHold, ObjectRedacted, PamledgerError
from schemas.redaction import PointerProblem, Redact, redacted_projection


def erase(head: ObjectHead, command: DeleteObject | TransitionState | Redact, stamp: Stamp, availability: str,
          event_type: str, context: Context, extra: dict[str, Any] | None = None) -> Decision:
    """A content-free version (tombstone); the content of every version of the object is erased."""
    _erasable(head, "deletion" if availability == "deleted" else "an erasing redaction", stamp, context)
    check_actor(command.actor, command.provenance)
    return _version(head, command, stamp, availability, event_type, None, erase_content=True, extra=extra)


def availability(head: ObjectHead, command: TransitionState, stamp: Stamp, context: Context) -> Decision:
    """A transition of the availability dimension (its table already checked by the caller)."""
    target = command.target_state
    if target == "deleted":
        return erase(head, command, stamp, "deleted", "object_deleted", context)
    if target == "redacted":
        return erase(head, command, stamp, "redacted", "availability_transitioned", context)
    if target == "available":
        return _restore(head, command, stamp, context)
    raise InvalidRequest(
        f"availability {target} is reached with the redact operation and its JSON Pointer targets",
        details={"object_id": head.object_id, "dimension": "availability", "to": target},
    )


def redact(head: ObjectHead, command: Redact, stamp: Stamp, context: Context) -> Decision:
    target = command.redaction_target
    current = head.state("availability")
    if current == "redacted":
        raise ObjectRedacted("object content is already redacted", details={"object_id": head.object_id})
    record: dict[str, Any] = {"erased": target.erase}
    if target.pointers is None:
        record["target"] = "content"
        if target.erase:
            return erase(head, command, stamp, "redacted", "object_redacted", context, {"redaction": record})
        check_actor(command.actor, command.provenance)
        return _version(head, command, stamp, "redacted", "object_redacted", None, extra={"redaction": record})
    if target.erase:
        _erasable(head, "an erasing redaction", stamp, context)
    check_actor(command.actor, command.provenance)
    stored = context.contents.get(head.content_digest) if head.content_digest is not None else None
    if stored is None:
        raise PamledgerError("the object's current content is not available to project", details={
            "object_id": head.object_id})
    try:
        projection = redacted_projection(decode_json(stored), target.pointers)
    except PointerProblem as problem:
        raise InvalidRequest(f"redaction pointer {problem.pointer!r} does not resolve: {problem.reason}",
                             details={"object_id": head.object_id, "pointer": problem.pointer,
                                      "reason": problem.reason}) from None
    content = canonical_bytes(projection)
    record["pointers"] = list(target.pointers)
    return _version(head, command, stamp, "partially_redacted", "object_redacted",
                    content_digest(stamp.salt, content), content=content, erase_content=target.erase,
                    extra={"redaction": record})


def _restore(head: ObjectHead, command: TransitionState, stamp: Stamp, context: Context) -> Decision:
    digest = context.restorable.get((head.scope_id, head.object_id))
    if digest is None:
        raise InvalidStateTransition(
            "the redacted content was erased: there is nothing to restore",
            details={"object_id": head.object_id, "dimension": "availability", "from": head.state("availability"),
                     "to": "available"})
    return _version(head, command, stamp, "available", "availability_transitioned", digest)


def _version(head: ObjectHead, command: Any, stamp: Stamp, availability: str, event_type: str, digest: str | None,
             content: bytes | None = None, erase_content: bool = False,
             extra: dict[str, Any] | None = None) -> Decision:
    meta = stamped(dict(head.meta), command.actor, command.provenance, stamp, head.sequence + 1)
    meta["availability_state"] = availability
    new = next_head(head, stamp, meta, digest)
    payload = transition_payload(head, "availability", head.state("availability"), availability,
                                 getattr(command, "policy_basis", None))
    payload.update(extra or {})
    event = version_event(command.actor, stamp, event_type, new, payload)
    return Decision(event=event, head=new, content=content, erase_content=erase_content)


def _erasable(head: ObjectHead, what: str, stamp: Stamp, context: Context) -> None:
    """Legal hold first (legal_hold), then the scope's minimum retention (retention_restriction)."""
    if head.state("retention") == "legal_hold":
        raise LegalHold(f"retention legal_hold blocks {what}", details={"object_id": head.object_id})
    days = minimum_retention_days(context.scope_policies.get(head.scope_id))
    if days is None:
        return
    created = context.created_at.get((head.scope_id, head.object_id))
    if created is None:  # the shell loads it whenever the policy asks; failing closed keeps the promise
        raise PamledgerError("the object's creation time is unknown: cannot check the scope's minimum retention")
    until = created + timedelta(days=days)
    if stamp.now < until:
        raise PamledgerError(
            f"the scope's retention policy keeps content {days} days: {what} is refused until then",
            details={"object_id": head.object_id, "minimum_days": days, "erasable_from": timestamp_text(until)},
            code="retention_restriction")


def minimum_retention_days(policy: Any) -> int | float | None:
    """The scope policy's `retention.minimum_days` when it is a positive number, else None."""
    retention = policy.get("retention") if isinstance(policy, dict) else None
    days = retention.get("minimum_days") if isinstance(retention, dict) else None
    if isinstance(days, bool) or not isinstance(days, (int, float)) or days <= 0:
        return None
    return days

