"""Promote (PAMSPEC 10.10): consolidate a working_memory object into a canonical Memory Object. Pure.

One command, four ledger entries in one batch (so one transaction): object_created for the new object
(provenance.transformation_parent = the source's version), lifecycle_transitioned moving the source to
superseded, relationship_created for a `derived_from` relationship directed from the new object to the
source, and a working_memory_promoted entry naming all of them. Either all commit or none.

The source must be a live, available working_memory object in lifecycle scratch, candidate or active, at the
expected version. Moving it to superseded is the promotion's own policy (the 9.5 table alone would forbid
scratch -> superseded without an override); the entry says so in its policy_basis.
"""

from __future__ import annotations

from typing import Any, Callable

import msgspec

from command_handler.core.relationships import create_relationship
from command_handler.core.state import Context, Decision, ObjectHead, Stamp
from command_handler.core.versions import (
    entry_event,
    follower_stamp,
    live_head,
    next_head,
    stamped,
    transition_payload,
    version_event,
)
from schemas.commands import CreateObject, Promote
from schemas.errors import InvalidRequest, InvalidStateTransition, ObjectRedacted, VersionConflict
from schemas.registry import TypeRegistry
from schemas.relationship import DERIVED_FROM, Relate

PROMOTABLE_LIFECYCLES = ("scratch", "candidate", "active")
PROMOTION_POLICY = "pamspec:promote"
Create = Callable[[ObjectHead | None, CreateObject, Stamp, TypeRegistry, Context], Decision]


def promote(head: ObjectHead | None, command: Promote, stamp: Stamp, registry: TypeRegistry, context: Context,
            create: Create) -> Decision:
    """`head` is the target object_id's head (None unless that id is taken); the source comes from the context."""
    source = _source(command, context)
    if command.target_object_type == "working_memory":
        raise InvalidRequest("promotion turns working memory into a canonical type, not into working memory",
                             details={"target_object_type": command.target_object_type})
    parent = command.provenance.transformation_parent
    if parent is not None and parent != source.version_id:
        raise InvalidRequest("provenance.transformation_parent must be the promoted source version (or left out)",
                             details={"transformation_parent": parent, "source_version_id": source.version_id})
    provenance = msgspec.structs.replace(command.provenance, transformation_parent=source.version_id)
    created = create(head, _create_command(command, provenance), stamp, registry, context)
    new = created.head
    assert new is not None
    superseded = _supersede(source, command, follower_stamp(stamp, 2))  # 1: a tool type's entry
    relationship = _derived_from(command, follower_stamp(stamp, 3, "rel"), context, new, source)
    assert superseded.head is not None and relationship.head is not None
    linked = {"source_object_id": source.object_id, "source_version_id": superseded.head.version_id,
              "promoted_object_id": new.object_id, "promoted_version_id": new.version_id,
              "promoted_object_type": command.target_object_type,
              "relationship_id": relationship.head.object_id, "relationship_version_id": relationship.head.version_id}
    entry = Decision(event=entry_event(command.actor, follower_stamp(stamp, 4), command.scope_id,
                                       "working_memory_promoted", linked, object_id=source.object_id), head=None)
    return msgspec.structs.replace(created, followers=(*created.followers, superseded, relationship, entry),
                                   result={"promotion": linked})


def _source(command: Promote, context: Context) -> ObjectHead:
    source = live_head(context.head(command.scope_id, command.source_object_id), command.source_object_id,
                       command.expected_version_id)
    object_type = source.meta.get("object_type")
    if object_type != "working_memory":
        raise InvalidRequest("only working_memory objects can be promoted",
                             details={"source_object_id": source.object_id, "object_type": object_type or "relationship"})
    if source.state("availability") != "available":
        raise ObjectRedacted("the working memory's content is redacted", details={"source_object_id": source.object_id})
    lifecycle = source.state("lifecycle")
    if lifecycle not in PROMOTABLE_LIFECYCLES:
        raise InvalidStateTransition(f"working memory in lifecycle {lifecycle} cannot be promoted",
                                     details={"source_object_id": source.object_id, "dimension": "lifecycle",
                                              "from": lifecycle, "to": "superseded",
                                              "promotable_from": list(PROMOTABLE_LIFECYCLES)})
    return source


def _create_command(command: Promote, provenance: Any) -> CreateObject:
    fields: dict[str, Any] = {
        "scope_id": command.scope_id, "object_type": command.target_object_type,
        "canonical_content": command.target_canonical_content, "actor": command.actor, "provenance": provenance,
        "object_id": command.target_object_id, "schema_id": command.target_schema_id,
        "lifecycle_state": command.target_lifecycle_state, "validation_state": command.target_validation_state,
        "quality_signals": command.quality_signals,
    }
    return CreateObject(**{name: value for name, value in fields.items() if value is not None})


def _supersede(source: ObjectHead, command: Promote, stamp: Stamp) -> Decision:
    meta = stamped(dict(source.meta), command.actor, command.provenance, stamp, source.sequence + 1)
    meta["lifecycle_state"] = "superseded"
    new = next_head(source, stamp, meta, source.content_digest)
    payload = transition_payload(source, "lifecycle", source.state("lifecycle"), "superseded", PROMOTION_POLICY)
    return Decision(event=version_event(command.actor, stamp, "lifecycle_transitioned", new, payload), head=new)


def _derived_from(command: Promote, stamp: Stamp, context: Context, new: ObjectHead, source: ObjectHead) -> Decision:
    relationship_id = command.relationship_id or stamp.object_id
    taken = context.head(command.scope_id, relationship_id)
    if taken is not None or relationship_id in (new.object_id, source.object_id):
        raise VersionConflict("an object or relationship with this relationship_id already exists in this scope",
                              details={"relationship_id": relationship_id})
    relate = Relate(scope_id=command.scope_id, source_object_id=new.object_id, target_object_id=source.object_id,
                    relationship_type=DERIVED_FROM, directionality="directed", actor=command.actor,
                    provenance=command.provenance, relationship_id=relationship_id)
    return create_relationship(relate, msgspec.structs.replace(stamp, object_id=relationship_id), command.scope_id)
