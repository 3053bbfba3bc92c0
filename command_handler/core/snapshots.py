"""Sealing an evaluation snapshot (PAMSPEC 18.11): pure, decided against the head and the ids already sealed.

The watermark is a ledger sequence at or below the head the command is decided at (the entries committed
before it, this batch's earlier ones included); absent, it is that head. Members are an explicit list of
objects the scope held at the watermark (else object_not_found) or, absent, every object of the scope at the
watermark (the schema's meaning of a missing `included_object_ids`, so sealing copies nothing however large
the scope). A sealed id never changes: any
command naming one again is invalid_state_transition, rule evaluation_snapshot_membership_frozen (a retry
with its idempotency key replays the original result before this is asked).
"""

from __future__ import annotations

from collections.abc import Container, Mapping
from typing import Any

import msgspec

from command_handler.core.state import Decision, Stamp
from command_handler.core.versions import entry_event
from schemas.common import timestamp_text
from schemas.errors import InvalidObject, InvalidRequest, InvalidStateTransition, ObjectNotFound
from schemas.snapshots import FROZEN_RULE, SNAPSHOT_ACTION, CreateSnapshot, with_digest

_OPTIONAL = ("included_object_ids", "included_embedding_space_ids", "deterministic_clock", "deterministic_rng_seed",
             "evaluation_run_id")


def seal(command: CreateSnapshot, stamp: Stamp, head: int, sealed: Container[str],
         born: Mapping[tuple[str, str], int]) -> Decision:
    """The `index_rebuilt` {snapshot_sealed} entry of a new snapshot, its descriptor as the result, or raise.
    `born`: the ledger sequence at which each named member came to be (its first version), where it exists."""
    request = command.snapshot
    if request.snapshot_id in sealed:
        raise InvalidStateTransition(
            "this snapshot is sealed: nothing about it changes; a changed snapshot needs a new snapshot_id",
            details={"snapshot_id": request.snapshot_id, "rule": FROZEN_RULE})
    if request.scope_id is not None and request.scope_id != command.scope_id:
        raise InvalidObject("the descriptor's scope_id is not the command's scope",
                            details={"scope_id": request.scope_id, "command_scope_id": command.scope_id})
    at = head if request.ledger_sequence_high_watermark is None else request.ledger_sequence_high_watermark
    if not 0 <= at <= head:
        raise InvalidRequest("ledger_sequence_high_watermark must be between 0 and the ledger head",
                             details={"ledger_sequence_high_watermark": at, "head": head})
    members = request.included_object_ids
    if members is not None and len(set(members)) != len(members):
        raise InvalidRequest("included_object_ids names an object twice", details={"field": "included_object_ids"})
    missing = [m for m in members or () if born.get((command.scope_id, m), at + 1) > at]
    if missing:
        raise ObjectNotFound("included_object_ids names objects this scope did not hold at the watermark",
                             details={"object_ids": missing[:20], "missing": len(missing),
                                      "ledger_sequence_high_watermark": at})
    descriptor: dict[str, Any] = {
        "snapshot_id": request.snapshot_id, "scope_id": command.scope_id, "sealed": True,
        "created_at": timestamp_text(stamp.now), "created_by_actor_id": command.actor.actor_id,
        "ledger_sequence_high_watermark": at,
    }
    for name in _OPTIONAL:
        value = getattr(request, name)
        if value is not None:
            descriptor[name] = msgspec.to_builtins(value)
    if request.deterministic_clock is not None:  # recorded times have one width (schemas.common.timestamp_text)
        descriptor["deterministic_clock"]["start_at"] = timestamp_text(request.deterministic_clock.start_at)
    descriptor = with_digest(descriptor)
    event = entry_event(command.actor, stamp, command.scope_id, "index_rebuilt",
                        {"action": SNAPSHOT_ACTION, "snapshot": descriptor})
    return Decision(event=event, head=None, result={"snapshot": descriptor})
