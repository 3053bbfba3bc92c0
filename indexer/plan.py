"""Pure core of the indexer: a batch of ledger events → what the batch asks of the vector tables.

Why a fold: only an object's last version in a batch matters (an update then a transition in the same batch
needs one vector, of the transition's version); an erasure anywhere after a version wins over it. Events
carry digests, never content, so the plan names versions and content digests; the shell reads the content.

What each event means here:
- `index_rebuilt` in the system scope: a space registration or a default switch (registry rows);
- `embedding_generated` / other `index_rebuilt` entries: the indexer's own records coming back, ignored;
- an event whose version is deleted or redacted (`object_deleted`, `object_redacted`, availability →
  deleted/redacted): erase every vector of the object;
- a partial redaction (`object_redacted` to `partially_redacted`, erasing or suppressing): erase every vector
  of the object (they were made from content that held the removed values), then embed the new version,
  whose content is the permitted projection. An object erased in a batch stays in `erased` even when a later
  version of the batch is embedded: the shell deletes first and writes after, and never moves a vector of an
  erased object (it would move the very vector it deleted);
- any other event with an envelope and a content digest: the object's new current version; a version it
  replaces within the batch with other content is `superseded`: it was current at some ledger sequence, so a
  snapshot sealed there searches it, and its vector is kept (embedding.store.keep_vectors), never made live.
  An erasure of the object later in the batch drops it (its content is gone);
- a Relationship Object's events (their envelope has no object_type, their event names `relationship_id`):
  ignored, relationships are not embedded.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import msgspec

from schemas.common import SYSTEM_SCOPE
from schemas.event_views import IndexedEvent, IndexedPayload


ERASING_EVENTS = frozenset({"object_deleted", "object_redacted"})
ERASED_STATES = frozenset({"deleted", "redacted"})
OWN_EVENTS = frozenset({"embedding_generated", "index_rebuilt"})


@dataclass(frozen=True)
class Version:
    """An object's version whose content may need a vector."""

    scope_id: str
    object_id: str
    version_id: str
    version_sequence: int
    ledger_sequence: int
    object_type: str
    content_digest: str

    @property
    def key(self) -> tuple[str, str]:
        return (self.scope_id, self.object_id)


@dataclass(frozen=True)
class Registration:
    """A `space_registered` entry: the descriptor as the ledger holds it (decoded by the shell)."""

    ledger_sequence: int
    embedding_space: Any
    space_digest: str


@dataclass(frozen=True)
class DefaultSwitch:
    ledger_sequence: int
    embedding_space_id: str


@dataclass
class Plan:
    """A batch's work, in the order the shell applies it: registry rows first, then erasures, then vectors.
    An object may be in both `erased` and `versions` (a partial redaction): its old vectors go, the new
    version's vector is written."""

    registry: list[Registration | DefaultSwitch] = field(default_factory=list)
    versions: dict[tuple[str, str], Version] = field(default_factory=dict)
    erased: set[tuple[str, str]] = field(default_factory=set)
    superseded: list[Version] = field(default_factory=list)  # replaced within the batch: vector kept only
    from_sequence: int = 0
    through_sequence: int = 0


_decode = msgspec.json.Decoder(IndexedEvent).decode


def plan_batch(events: list[tuple[int, bytes]]) -> Plan:
    """Fold a batch (ledger sequence, canonical event bytes), in ledger order, into one Plan.

    Tolerant: fields it does not know are ignored (old readers read new data); an event it cannot decode at
    all raises (msgspec.DecodeError), and the follower reports it stuck rather than skipping it."""
    plan = Plan(from_sequence=events[0][0] if events else 0, through_sequence=events[-1][0] if events else 0)
    for seq, raw in events:
        event = _decode(raw)
        payload = event.payload or IndexedPayload()
        if event.event_type in OWN_EVENTS:
            if event.scope_id == SYSTEM_SCOPE and event.event_type == "index_rebuilt":
                _registry(plan, seq, payload)
            continue
        if event.object_id is None or payload.envelope is None or event.scope_id == SYSTEM_SCOPE:
            continue  # the system scope's objects (actors, credentials) are not memory: never embedded
        meta = payload.envelope
        if meta.object_type is None:  # only a relationship's envelope has none, and its events name no object_id
            continue
        key = (event.scope_id, event.object_id)
        if event.event_type in ERASING_EVENTS or meta.availability_state in ERASED_STATES:
            plan.erased.add(key)
            plan.superseded = [v for v in plan.superseded if v.key != key]
            plan.versions.pop(key, None)  # erased: nothing of what came before is kept
        if meta.availability_state in ERASED_STATES:
            plan.versions.pop(key, None)  # nothing of the object is left to embed
        elif payload.content_digest is not None:
            replaced = plan.versions.get(key)
            if replaced is not None and replaced.content_digest != payload.content_digest:
                plan.superseded.append(replaced)
            plan.versions[key] = Version(event.scope_id, event.object_id, meta.version_id, meta.sequence, seq,
                                         meta.object_type, payload.content_digest)
    return plan


def _registry(plan: Plan, seq: int, payload: IndexedPayload) -> None:
    if payload.action == "space_registered" and payload.embedding_space is not None and payload.space_digest:
        plan.registry.append(Registration(seq, payload.embedding_space, payload.space_digest))
    elif payload.action == "default_space_set" and payload.embedding_space_id:
        plan.registry.append(DefaultSwitch(seq, payload.embedding_space_id))
