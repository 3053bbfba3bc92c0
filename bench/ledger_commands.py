"""The synthetic command stream of bench.ledger_loader: what each chunk of the ledger says, in order.

A chunk is exactly `LoadSpec.chunk` events (the last may be shorter) and self-contained: objects created
in it get their follow-ups (an update and/or a validation transition) inside it, so chunks can be
decided independently in worker processes. Everything is a function of (spec, chunk index) except the
random ids and salts.
"""

from __future__ import annotations

import heapq
import os
import random
from collections.abc import Iterator
from datetime import datetime, timedelta, timezone
from typing import Any

import msgspec

from bench.ledger_content import ContentMaker
from command_handler.core.state import Stamp
from schemas.commands import CreateObject, ObjectCommand, TransitionState, UpdateObject
from schemas.envelope import Actor, Provenance
from schemas.registry import default_registry

REGISTRY = default_registry()  # the writer's tables: generated transitions must be ones it accepts

Key = tuple[str, str]
ACTORS = tuple(Actor(actor_id=f"actor:m2:agent-{i}", actor_kind="agent") for i in range(8))
PROVENANCES = tuple(Provenance(provenance_id=f"prov:m2:pipeline-{i}", actor=a, activity="m2-synthetic-load")
                    for i, a in enumerate(ACTORS))
NEXT_VALIDATION = {"unverified": ("corroborated", "corroborated", "corroborated", "rejected"),
                   "corroborated": ("disputed",), "disputed": ("corroborated", "rejected"), "rejected": ("disputed",)}
CREATE_VALIDATION = ("corroborated",) * 5 + ("unverified",) * 4 + ("disputed",)


class LoadSpec(msgspec.Struct, frozen=True, kw_only=True):
    """What to load: exactly `events` ledger events (objects ~ events / (1 + both shares))."""

    events: int
    scopes: int = 100
    update_share: float = 0.12
    transition_share: float = 0.18
    follow_up_window: int = 2000
    span_days: float = 90.0
    chunk: int = 10_000
    seed: int = 20261129
    workers: int = 2
    t_end: float = 0.0  # epoch seconds the synthetic clock ends at (0: now)


def scope_ids(count: int) -> list[str]:
    return [f"workspace:m2-{i:03d}" for i in range(count)]


_IDS = random.Random(os.urandom(32))  # ids and salts: unique and unpredictable enough for synthetic data, and fast


def _uuid4() -> str:
    """A random (version 4) uuid in the writer's text form, without the uuid module's overhead."""
    h = "%032x" % (_IDS.getrandbits(128) & _UUID_CLEAR | _UUID_SET)
    return f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"


_UUID_CLEAR = ~((0xF000 << 64) | (0xC000 << 48))
_UUID_SET = (4 << 76) | (0x8000 << 48)


def chunk_commands(spec: LoadSpec, index: int) -> Iterator[tuple[ObjectCommand, Stamp, bool]]:
    """Chunk `index`: exactly spec.chunk (or the remainder) commands with their stamps, in ledger order.

    Yields (command, stamp, keep_head): keep_head is True while the object still has a follow-up due.
    """
    rng = random.Random(spec.seed * 1_000_003 + index)
    maker = ContentMaker(rng, spec.seed)
    scopes = scope_ids(spec.scopes)
    first = index * spec.chunk + 1
    last = min(spec.events, first + spec.chunk - 1)
    t_end = datetime.fromtimestamp(spec.t_end, timezone.utc) if spec.t_end else datetime.now(timezone.utc)
    step = timedelta(days=spec.span_days) / spec.events
    due: list[tuple[int, int, Key, str]] = []
    state: dict[Key, list[Any]] = {}  # key -> [version_id, validation_state, follow-ups still due]
    for position in range(first, last + 1):
        now = t_end - step * (spec.events - position)
        who = int(rng.random() * len(ACTORS))
        if due and (due[0][0] <= position or last - position + 1 <= len(due)):
            _, _, key, kind = heapq.heappop(due)
            st = state[key]
            stamp = Stamp(operation_id=f"op:{_uuid4()}", event_id=f"evt:{_uuid4()}", version_id=f"ver:{_uuid4()}",
                          object_id=key[1], now=now, salt=_IDS.randbytes(16))
            command: ObjectCommand
            if kind == "update":
                command = UpdateObject(scope_id=key[0], object_id=key[1], expected_version_id=st[0],
                                       canonical_content=maker.content("claim"), actor=ACTORS[who],
                                       provenance=PROVENANCES[who])
            else:
                target = rng.choice(NEXT_VALIDATION[st[1]])
                assert target in REGISTRY.allowed_targets("validation", st[1])
                command = TransitionState(scope_id=key[0], object_id=key[1], expected_version_id=st[0],
                                          dimension="validation", target_state=target, actor=ACTORS[who],
                                          provenance=PROVENANCES[who], policy_basis="m2 synthetic review")
                st[1] = target
            st[0], st[2] = stamp.version_id, st[2] - 1
            if st[2] == 0:
                del state[key]
            yield command, stamp, st[2] > 0
            continue
        object_type = maker.object_type()
        stamp = Stamp(operation_id=f"op:{_uuid4()}", event_id=f"evt:{_uuid4()}", version_id=f"ver:{_uuid4()}",
                      object_id=f"mem:{_uuid4()}", now=now, salt=_IDS.randbytes(16))
        command = CreateObject(
            scope_id=scopes[int(rng.random() * len(scopes))], object_type=object_type,
            canonical_content=maker.content(object_type), actor=ACTORS[who], provenance=PROVENANCES[who],
            validation_state=CREATE_VALIDATION[int(rng.random() * 10)],  # type: ignore[arg-type]
            lifecycle_state="candidate" if rng.random() < 0.08 else None,
            observed_at=now - timedelta(minutes=1 + int(rng.random() * 600)) if object_type == "observation" else None,
        )
        key = (command.scope_id, stamp.object_id)
        kinds = [k for k, share in (("update", spec.update_share), ("transition", spec.transition_share))
                 if rng.random() < share]
        if last - position < len(due) + len(kinds):
            kinds = []  # no room left in this chunk for its follow-ups
        if kinds:
            state[key] = [stamp.version_id, command.validation_state, len(kinds)]
            for kind in kinds:
                heapq.heappush(due, (position + 1 + int(rng.random() * spec.follow_up_window), position, key, kind))
        yield command, stamp, bool(kinds)
