"""Tool memory (PAMSPEC 8.2): a tool_result names a live tool_invocation of its scope, and creating either
writes its event-only entry (tool_invoked / tool_completed) after object_created. Pure."""

from __future__ import annotations

from typing import Any

from command_handler.core.state import Context, Decision, ObjectHead, Stamp
from command_handler.core.versions import entry_event, follower_stamp
from schemas.commands import CreateObject
from schemas.errors import InvalidObject

TOOL_EVENTS = {"tool_invocation": "tool_invoked", "tool_result": "tool_completed"}


def check_invocation(command: CreateObject, context: Context) -> None:
    """A tool_result's invocation_object_id names a live tool_invocation of this scope."""
    invocation_id = command.canonical_content["invocation_object_id"]
    invocation = context.head(command.scope_id, invocation_id)
    problem = None
    if invocation is None or invocation.deleted:
        problem = "names no tool_invocation in this scope"
    elif invocation.meta.get("object_type") != "tool_invocation":
        problem = f"names a {invocation.meta.get('object_type') or 'relationship'}, not a tool_invocation"
    if problem is not None:
        raise InvalidObject(f"canonical_content.invocation_object_id {problem}",
                            details={"field": "/canonical_content/invocation_object_id",
                                     "invocation_object_id": invocation_id})


def tool_entry(command: CreateObject, stamp: Stamp, event_type: str, new: ObjectHead) -> Decision:
    """tool_invoked / tool_completed: the event-only entry beside a tool memory object's creation. Ids only: the
    ledger and its replica are append-only, so nothing of the content (not even the tool's name or the
    outcome) goes into an entry an erasure could not reach."""
    payload: dict[str, Any] = {"object_id": new.object_id, "version_id": new.version_id}
    if event_type == "tool_completed":
        payload["invocation_object_id"] = command.canonical_content["invocation_object_id"]
    return Decision(event=entry_event(command.actor, follower_stamp(stamp, 1), command.scope_id, event_type, payload,
                                      object_id=new.object_id), head=None)
