"""Evaluation runs (PAMSPEC 18.11, schemas.evaluation): opening and closing one, and the stamps of its commands.

Pure. A run's commands are stamped from the run, not the system: with a declared clock, a command's time is
`start_at + tick_ms x index`, where `index` is the number of ledger entries its scope holds before the
command (the start entry is 0); with a declared seed, every id and salt the writer makes for it is drawn
from HMAC-SHA256 keyed by the seed over (scope, index, purpose, block). The index comes from the ledger (the
scope's entries as loaded, plus this batch's), so it survives a writer restart, and the same script against
the same snapshot gives the same bytes.
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Callable, Collection, Mapping
from datetime import datetime, timedelta
from typing import Any

import msgspec

from command_handler.core.ids import stamp_from
from command_handler.core.intake import Parsed
from command_handler.core.state import Decision, ObjectHead, Stamp
from command_handler.core.versions import entry_event
from schemas.errors import InvalidRequest, InvalidStateTransition, SnapshotNotFound
from schemas.evaluation import ENDED_ACTION, ENDED_RULE, RUN_TAKEN_RULE, STARTED_ACTION, TAKEN_RULE, \
    EndEvaluation, StartEvaluation

DEFAULT_TICK_MS = 1  # a declared clock without tick_ms advances a millisecond per entry


class EvaluationRun(msgspec.Struct, frozen=True, kw_only=True):
    """One run as the writer decides by it (the evaluation_runs row and the scope's entry count)."""

    scope_id: str  # the evaluation scope
    run_id: str
    snapshot_id: str
    base_scope_id: str
    watermark: int
    clock_start: datetime | None = None
    tick_ms: int = DEFAULT_TICK_MS
    seed: int | None = None
    entries: int = 0  # the scope's ledger entries before the batch
    ended: bool = False


def open_run(command: StartEvaluation, descriptor: Mapping[str, Any] | None, scope_taken: bool,
             run_ids: Collection[str]) -> EvaluationRun:
    """The run eval_start opens from the sealed snapshot `descriptor` (None: not sealed), or raise."""
    if descriptor is None or descriptor.get("scope_id") != command.scope_id:
        raise SnapshotNotFound("no sealed snapshot of this id in this scope",
                               details={"snapshot_id": command.snapshot_id, "scope_id": command.scope_id})
    if command.evaluation_scope_id == command.scope_id:
        raise InvalidRequest("an evaluation scope is a new scope, never the snapshot's",
                             details={"evaluation_scope_id": command.evaluation_scope_id})
    declared = descriptor.get("evaluation_run_id")
    if declared is not None and command.evaluation_run_id not in (None, declared):
        raise InvalidRequest("the snapshot declares another evaluation_run_id",
                             details={"evaluation_run_id": command.evaluation_run_id, "declared": declared})
    run_id = command.evaluation_run_id or declared
    if run_id is None:
        raise InvalidRequest("name an evaluation_run_id (the snapshot declares none)",
                             details={"field": "evaluation_run_id"})
    if scope_taken:
        raise InvalidStateTransition("the evaluation scope exists already: a run forks into a new scope",
                                     details={"evaluation_scope_id": command.evaluation_scope_id, "rule": TAKEN_RULE})
    if run_id in run_ids:
        raise InvalidStateTransition("this evaluation_run_id was started already",
                                     details={"evaluation_run_id": run_id, "rule": RUN_TAKEN_RULE})
    clock = descriptor.get("deterministic_clock")
    return EvaluationRun(
        scope_id=command.evaluation_scope_id, run_id=run_id, snapshot_id=command.snapshot_id,
        base_scope_id=command.scope_id, watermark=int(descriptor["ledger_sequence_high_watermark"]),
        clock_start=datetime.fromisoformat(clock["start_at"]) if clock else None,
        tick_ms=int(clock.get("tick_ms") or DEFAULT_TICK_MS) if clock else DEFAULT_TICK_MS,
        seed=descriptor.get("deterministic_rng_seed"))


def started(command: StartEvaluation, run: EvaluationRun, stamp: Stamp, descriptor: Mapping[str, Any]) -> Decision:
    """The run's first entry, in its scope: what it forks and how it is stamped."""
    payload: dict[str, Any] = {
        "action": STARTED_ACTION, "snapshot_id": run.snapshot_id, "base_scope_id": run.base_scope_id,
        "ledger_sequence_high_watermark": run.watermark, "snapshot_digest": descriptor["digest"]}
    if descriptor.get("deterministic_clock") is not None:
        payload["deterministic_clock"] = descriptor["deterministic_clock"]
    if run.seed is not None:
        payload["deterministic_rng_seed"] = run.seed
    event = entry_event(command.actor, stamp, run.scope_id, "index_rebuilt", payload)
    return Decision(event=event, head=None, result={"evaluation_run": run_record(run)})


def ended(command: EndEvaluation, run: EvaluationRun, stamp: Stamp, index: int) -> Decision:
    """The run's last entry; refused when it ended already."""
    refuse_ended(run)
    event = entry_event(command.actor, stamp, run.scope_id, "index_rebuilt", {"action": ENDED_ACTION, "entries": index})
    return Decision(event=event, head=None, result={"evaluation_run": {**run_record(run), "ended": True}})


def refuse_ended(run: EvaluationRun) -> None:
    if run.ended:
        raise InvalidStateTransition("this evaluation run has ended: its scope is read-only",
                                     details={"scope_id": run.scope_id, "evaluation_run_id": run.run_id,
                                              "rule": ENDED_RULE})


def run_record(run: EvaluationRun) -> dict[str, Any]:
    """The run as replies and the evaluation_runs row show it."""
    record = msgspec.to_builtins(run)
    record.pop("entries")
    record.pop("ended")
    return {k: v for k, v in record.items() if v is not None}


def run_of(record: Mapping[str, Any], entries: int, is_ended: bool) -> EvaluationRun:
    """The run a stored record (run_record) describes, with its scope's entry count."""
    return msgspec.convert({**record, "entries": entries, "ended": is_ended}, EvaluationRun)


def forked_head(base: ObjectHead, run: EvaluationRun) -> ObjectHead:
    """The snapshot's version of an object the run has not written, as the evaluation scope's head before
    its first version there (copy on write): the run's first write of it takes that version as its base
    (expected_version_id, content, states) and becomes the object's version 1 in the evaluation scope."""
    return ObjectHead(scope_id=run.scope_id, object_id=base.object_id, version_id=base.version_id, sequence=0,
                      meta={**base.meta, "scope_id": run.scope_id}, content_digest=base.content_digest)


def forkable(descriptor: Mapping[str, Any] | None, object_id: str) -> bool:
    """Whether the run's snapshot holds the object (every object of its scope, unless it names members)."""
    members = (descriptor or {}).get("included_object_ids")
    return descriptor is not None and (members is None or object_id in members)


def run_stamp(parsed: Parsed, run: EvaluationRun, index: int, fresh: Stamp, purpose: bytes = b"") -> Stamp:
    """The stamp of the run's entry number `index`: the run's clock and seed where declared, else `fresh`'s
    time and ids; always naming the run. `purpose` tells apart two stamps of one command."""
    now = fresh.now if run.clock_start is None else run.clock_start + timedelta(milliseconds=run.tick_ms * index)
    if run.seed is None:
        return msgspec.structs.replace(fresh, now=now, evaluation_run_id=run.run_id)
    return stamp_from(parsed, _stream(run, index, purpose), now, run.run_id)


def _stream(run: EvaluationRun, index: int, purpose: bytes) -> Callable[[int], bytes]:
    """n bytes at a time from HMAC-SHA256(seed, scope | index | purpose | block), blocks counted up."""
    key = int(run.seed or 0).to_bytes(8, "big", signed=True)
    label = b"\x00".join((run.scope_id.encode(), str(index).encode(), purpose))
    block = 0

    def draw(n: int) -> bytes:
        nonlocal block
        out = b""
        while len(out) < n:
            out += hmac.new(key, label + b"\x00" + str(block).encode(), hashlib.sha256).digest()
            block += 1
        return out[:n]
    return draw
