"""What a command names besides what it carries: the objects whose heads it needs, the delegation it acts on
or under, whether it may erase content. Pure: the writer shell loads what these say before deciding."""

from __future__ import annotations

from typing import Any

from command_handler.core.imports import entry_keys
from schemas.commands import CreateObject, DeleteObject, ImportEntries, Promote, TransitionState
from schemas.delegation import CheckDelegation, GrantDelegation, RevokeDelegation
from schemas.redaction import Redact
from schemas.relationship import Relate

DELEGATION_COMMANDS = (GrantDelegation, CheckDelegation, RevokeDelegation)


def head_keys(command: Any) -> list[tuple[str, str]]:
    """(scope_id, object_id) of every head a command needs: its own object's and those it names."""
    if isinstance(command, Promote):
        own = command.target_object_id
    elif isinstance(command, Relate):
        own = command.relationship_id
    else:
        own = getattr(command, "object_id", None)
    keys = named_objects(command)
    if own is not None:
        keys.append((command.scope_id, own))
    return keys


def named_objects(command: Any) -> list[tuple[str, str]]:
    """(scope_id, object_id) of every object a command looks at besides the one it writes: what the writer
    loads into the Context before deciding."""
    scope_id = command.scope_id
    if isinstance(command, ImportEntries):
        return entry_keys(command)
    if isinstance(command, Relate):
        keys = [(scope_id, command.source_object_id), (command.target_scope_id or scope_id, command.target_object_id)]
        return keys
    if isinstance(command, Promote):
        keys = [(scope_id, command.source_object_id)]
        if command.relationship_id is not None:
            keys.append((scope_id, command.relationship_id))
        if command.target_object_type == "tool_result":
            keys += _invocation(scope_id, command.target_canonical_content)
        return keys
    if isinstance(command, CreateObject) and command.object_type == "tool_result":
        return _invocation(scope_id, command.canonical_content)
    return []


def erases_content(command: Any) -> bool:
    """True for commands that may erase stored content (what a scope's minimum retention guards)."""
    if isinstance(command, DeleteObject):
        return True
    if isinstance(command, Redact):
        return command.redaction_target.erase
    return isinstance(command, TransitionState) and command.dimension == "availability" \
        and command.target_state in ("redacted", "deleted")


def _invocation(scope_id: str, content: Any) -> list[tuple[str, str]]:
    """The tool_invocation a tool_result's content names, if it names one."""
    invocation = content.get("invocation_object_id") if isinstance(content, dict) else None
    return [(scope_id, invocation)] if isinstance(invocation, str) else []


def delegation_named(command: Any) -> str | None:
    """The delegation a command acts on (delegation commands) or under (its actor's delegation_id)."""
    if isinstance(command, DELEGATION_COMMANDS):
        return command.delegation_id
    actor = getattr(command, "actor", None)
    return getattr(actor, "delegation_id", None)
