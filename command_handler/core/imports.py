"""An import's chunk: a bundle's ledger entries replayed as they were, checked one by one. Pure.

What an entry must be to be written (else the chunk is refused whole, naming the entry): an event of a
replayed type (schemas.bundle.REPLAYED) that decodes into its type and encodes back to the very bytes it
came as (no field its type does not know); in the scope the import writes; a version event with its envelope
agreeing with the event's; a first version (sequence 1) of an object this scope does not hold, or the next
version of the head the import left (sequence + 1, previous_version_id); ids this ledger has not used
(`version_id_reuse`, invalid_object); and content, where the bundle carries it, whose salted digest is the
event's. A replayed erasure erases what the import stored before it, as the writer's own erasures do. The service mints nothing for a replayed entry: ids, times, actors and provenance are the bundle's.
The last chunk adds the entry recording the import (schemas.events.ScopeImported).

An entry's vectors (a bundle exported with --vectors) go to the indexer (Decision.handoff) where this service
registered the same space (same id, same descriptor digest: schemas.embedding.same_space) and the version
shows its content; the others are left out, and the indexer embeds the version as any other. The chunk's
reply says how many of each (`vectors_handed_over`, `vectors_left`).
"""

from __future__ import annotations

from typing import Any

import msgspec

from command_handler.core.state import NO_IMPORT_FACTS, Context, Decision, ObjectHead, Stamp
from schemas.embedding import HandedVector
from command_handler.core.versions import entry_event
from schemas.bundle import (
    FIRST_VERSION_EVENTS, REPLAYED, VERSION_EVENTS, chunk_key, envelope_agrees, envelope_meta, shown_content,
    typed_event,
)
from schemas.commands import ImportedEntry, ImportEntries
from schemas.errors import InvalidObject, InvalidRequest, ObjectNotFound, VersionConflict


def entry_keys(command: ImportEntries) -> list[tuple[str, str]]:
    """(scope_id, object_id) of every object or relationship the chunk's version entries name."""
    keys = []
    for entry in command.entries:
        name = entry.event.get("object_id") or entry.event.get("relationship_id")
        if isinstance(name, str) and entry.event.get("event_type") in VERSION_EVENTS:
            keys.append((command.scope_id, name))
    return keys


def entry_ids(command: ImportEntries) -> list[str]:
    """Every event and version id the chunk would write (the shell asks which this ledger already has)."""
    ids = []
    for entry in command.entries:
        for name in ("event_id", "version_id"):
            value = entry.event.get(name)
            if isinstance(value, str):
                ids.append(value)
    return ids


def import_chunk(command: ImportEntries, stamp: Stamp, context: Context) -> Decision:
    facts = context.imports.get((command.scope_id, chunk_key(command.bundle_digest, command.chunk)), NO_IMPORT_FACTS)
    if command.chunk == 0 and facts.occupied:
        raise InvalidRequest("an import writes into a new or empty scope, and this one holds ledger entries",
                             details={"scope_id": command.scope_id, "rule": "import.scope_not_empty"})
    if command.chunk > 0 and not facts.previous_committed:
        raise InvalidRequest(f"chunk {command.chunk - 1} of this bundle has not been imported here: send the"
                             " chunks in order", details={"chunk": command.chunk, "rule": "import.chunk_order"})
    heads: dict[tuple[str, str], ObjectHead] = {}
    seen: set[str] = set()
    decisions = [_replayed(index, entry, command, heads, context, facts.taken, seen, facts.spaces)
                 for index, entry in enumerate(command.entries)]
    offered = sum(len(entry.vectors or ()) for entry in command.entries)
    handed = sum(len(decision.handoff) for decision in decisions)
    if command.final:
        decisions.append(Decision(event=entry_event(command.actor, stamp, command.scope_id, "index_rebuilt", {
            "action": "scope_imported", "bundle_digest": command.bundle_digest,
            "source_ledger_id": command.source_ledger_id, "source_scope_id": command.source_scope_id,
            "watermark": command.watermark, "chunks": command.chunk + 1,
            **({"scope_map": command.scope_map} if command.scope_map else {}),
            **({"counts": command.counts} if command.counts is not None else {}),
        }), head=None))
    if not decisions:
        raise InvalidRequest("an import chunk names no entry", details={"chunk": command.chunk})
    first, *rest = decisions
    counts = {"vectors_handed_over": handed, "vectors_left": offered - handed} if offered else None
    return msgspec.structs.replace(first, followers=tuple(rest), result=counts)


def _replayed(index: int, entry: ImportedEntry, command: ImportEntries, heads: dict[tuple[str, str], ObjectHead],
              context: Context, taken: frozenset[str], seen: set[str], spaces: dict[str, str]) -> Decision:
    where = {"chunk": command.chunk, "entry": index}
    event_type = entry.event.get("event_type")
    if event_type not in REPLAYED:
        raise InvalidRequest(f"entry {index}: {event_type!r} entries are not replayed by an import",
                             details={**where, "event_type": event_type, "replayed": sorted(REPLAYED)})
    event = typed_event(entry.event)
    if isinstance(event, str):
        raise InvalidRequest(f"entry {index}: {event}", details={**where, "reason": event})
    if event.scope_id != command.scope_id:
        raise InvalidRequest(f"entry {index}: the event is of scope {event.scope_id!r}, not of the scope it is"
                             " imported into", details={**where, "scope_id": event.scope_id})
    for name in (event.event_id, event.version_id):
        if name is not None and (name in taken or name in seen):
            raise InvalidObject(f"entry {index}: {name} is already used in this ledger; version and event ids"
                                " are never reused", details={**where, "id": name, "rule": "version_id_reuse"})
        if name is not None:
            seen.add(name)
    if event_type not in VERSION_EVENTS:
        return Decision(event=event, head=None)
    decision = _version(index, entry, event, heads, context, where)
    return msgspec.structs.replace(decision, handoff=_handoff(entry, event, decision.head, spaces))


def _handoff(entry: ImportedEntry, event: Any, head: ObjectHead | None,
             spaces: dict[str, str]) -> tuple[HandedVector, ...]:
    """The entry's vectors the indexer may take: of an object's version whose content the bundle shows (its
    salt came, checked against the digest), one per space registered here with the same descriptor digest."""
    if not entry.vectors or head is None or entry.salt is None or head.content_digest is None \
            or event.object_id is None or head.meta.get("availability_state") in ("deleted", "redacted"):
        return ()
    rows: dict[str, HandedVector] = {}
    for vector in entry.vectors:
        if spaces.get(vector.embedding_space_id) == vector.space_digest and vector.embedding_space_id not in rows:
            rows[vector.embedding_space_id] = HandedVector(
                scope_id=head.scope_id, object_id=head.object_id, embedding_space_id=vector.embedding_space_id,
                space_digest=vector.space_digest, version_id=head.version_id, version_sequence=head.sequence,
                content_digest=head.content_digest, vector=tuple(vector.vector))
    return tuple(rows.values())


def _version(index: int, entry: ImportedEntry, event: Any, heads: dict[tuple[str, str], ObjectHead],
             context: Context, where: dict[str, Any]) -> Decision:
    if entry.envelope is None:
        raise InvalidRequest(f"entry {index}: a version's event comes with its envelope", details=where)
    meta = envelope_meta(entry.envelope)
    if not envelope_agrees(entry.envelope, event):
        raise InvalidRequest(f"entry {index}: the version's envelope does not agree with its event",
                             details={**where, "version_id": event.version_id})
    name = event.object_id or event.relationship_id
    key = (event.scope_id, name)
    head = heads.get(key) or context.head(*key)
    if event.event_type in FIRST_VERSION_EVENTS:
        if head is not None or event.sequence != 1:
            raise VersionConflict(f"entry {index}: {name} already exists in this scope",
                                  details={**where, "object_id": name})
    elif head is None:
        raise ObjectNotFound(f"entry {index}: a later version of {name}, whose first the import has not written",
                             details={**where, "object_id": name})
    elif event.sequence != head.sequence + 1 or event.payload.previous_version_id != head.version_id:
        raise VersionConflict(f"entry {index}: version {event.sequence} of {name} does not follow version"
                              f" {head.sequence}", details={**where, "object_id": name,
                                                            "current_version_id": head.version_id})
    digest = event.payload.content_digest
    content = salt = None
    if entry.salt is not None and not (head is not None and head.content_digest == digest):
        # (a version that keeps its object's content, a transition's, stores nothing new: the first did)
        salt = bytes.fromhex(entry.salt)
        content = shown_content(entry.envelope, entry.salt, digest)
        if content is None:
            raise InvalidObject(f"entry {index}: the content does not match the event's digest",
                                details={**where, "version_id": event.version_id})
    new = ObjectHead(scope_id=event.scope_id, object_id=name, version_id=event.version_id, sequence=event.sequence,
                     meta=meta, content_digest=digest)
    heads[key] = new
    # A replayed erasure erases as the writer's own does (the batch's erase step: every stored content of the
    # object but what the new head keeps), so no bundle can leave content behind an erasure it carries.
    return Decision(event=event, head=new, content=content, salt=salt, erase_content=erases(event))


def erases(event: Any) -> bool:
    """Whether a version event erased its object's content where it was written (what verify calls erasing)."""
    if event.event_type == "object_deleted":
        return True
    if event.event_type == "availability_transitioned":
        return bool(event.payload.to in ("redacted", "deleted"))
    return bool(event.event_type == "object_redacted" and (event.payload.redaction or {}).get("erased") is True)
