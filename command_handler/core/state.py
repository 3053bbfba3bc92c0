"""What the writer's core knows about an object: its head version, as plain data."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from types import MappingProxyType
from typing import Any, Protocol

import msgspec

from schemas.embedding import HandedVector


class ObjectHead(msgspec.Struct, frozen=True, kw_only=True):
    """The latest version of one object: its envelope metadata (no content) and content digest."""

    scope_id: str
    object_id: str
    version_id: str
    sequence: int
    meta: dict[str, Any]
    content_digest: str | None

    @property
    def deleted(self) -> bool:
        return bool(self.meta["availability_state"] == "deleted")

    def state(self, dimension: str) -> str:
        return str(self.meta[f"{dimension}_state"])


class Stamp(msgspec.Struct, frozen=True, kw_only=True):
    """Ids and time the shell hands the core, so the core has no clock or uuid of its own."""

    operation_id: str
    event_id: str
    version_id: str
    object_id: str
    now: datetime
    salt: bytes
    # Fresh uuid4 texts for commands that write more than one entry (promote, relate, tool memory): the core
    # takes its further event, version and object ids from here, in order.
    spare: tuple[str, ...] = ()
    # The evaluation run of the command's scope (schemas.evaluation), if any: carried into every version's
    # provenance (an evidence_refs entry) and every entry's payload.
    evaluation_run_id: str | None = None


class Authority(Protocol):
    """What the writer's policy says about actors' own grants (everything, where auth is off)."""

    def holds(self, actor_id: str, scope_id: str, operation: str) -> bool: ...

    def administers(self, actor_id: str) -> bool: ...


class _Everything:
    """The authority where auth is off (or the policy only decides requests): every actor holds everything."""

    def holds(self, actor_id: str, scope_id: str, operation: str) -> bool:
        return True

    def administers(self, actor_id: str) -> bool:
        return True


EVERYTHING = _Everything()


class ImportFacts(msgspec.Struct, frozen=True, kw_only=True):
    """What the ledger says about an import's chunk (command_handler.core.imports), loaded by the shell:
    whether its scope holds entries, whether the bundle's previous chunk committed here, and which of the
    chunk's event and version ids this ledger already has."""

    occupied: bool = False
    previous_committed: bool = False
    taken: frozenset[str] = frozenset()
    # The spaces the chunk's vectors name that this service registered: id -> its descriptor's digest
    spaces: dict[str, str] = {}


NO_IMPORT_FACTS = ImportFacts()
_NOTHING: Mapping[Any, Any] = MappingProxyType({})


@dataclass(frozen=True)
class Context:
    """What a command may look at besides its own object's head: the heads of the other objects it names
    (a relationship's endpoints, a promoted source, a tool result's invocation), keyed (scope_id, object_id)
    and current as of the batch; the actors' grants; and per object the digest of the last content a
    suppressing redaction hid, where content storage still holds it (what a restoration brings back); and
    the current content of objects a partial redaction projects."""

    heads: Mapping[tuple[str, str], ObjectHead] = field(default_factory=lambda: _NOTHING)
    authority: Authority = EVERYTHING
    restorable: Mapping[tuple[str, str], str] = field(default_factory=lambda: _NOTHING)
    contents: Mapping[str, bytes] = field(default_factory=lambda: _NOTHING)  # by digest: what a partial redaction reads
    # For commands that would erase content in a scope whose policy sets retention.minimum_days: that policy
    # (by scope) and when each object was created (by (scope_id, object_id)).
    scope_policies: Mapping[str, Any] = field(default_factory=lambda: _NOTHING)
    created_at: Mapping[tuple[str, str], datetime] = field(default_factory=lambda: _NOTHING)
    # By (scope_id, the chunk's idempotency key): what an import's chunk needs to know (core.imports)
    imports: Mapping[tuple[str, str], ImportFacts] = field(default_factory=lambda: _NOTHING)

    def head(self, scope_id: str, object_id: str) -> ObjectHead | None:
        return self.heads.get((scope_id, object_id))


NO_CONTEXT = Context()


class Decision(msgspec.Struct, frozen=True, kw_only=True):
    """What one accepted command does: one ledger event, the version it commits, content to store or erase."""

    event: Any  # one of schemas.events.Event
    head: ObjectHead | None  # None for event-only ledger entries (no Memory Version)
    content: bytes | None = None
    salt: bytes | None = None  # the salt of `content`'s digest when not the command stamp's (a follower's own)
    erase_content: bool = False  # erase the object's stored content, all but the new head's own (if it has any)
    result: dict[str, Any] | None = None  # an event-only entry's own result fields (a delegation's grant)
    # Entries the same command writes after this one, in order, in the same transaction (promote: the source's
    # superseded version, the derived_from relationship, the working_memory_promoted entry).
    followers: tuple["Decision", ...] = ()
    handoff: tuple[HandedVector, ...] = ()  # an import's vectors of this version, for the indexer
