"""Redact (PAMSPEC 10.9): the command, its redaction target and the pure JSON Pointer projection.

A redaction target is either the whole content (no `pointers`: availability `redacted`, a tombstone
version) or a list of RFC 6901 JSON Pointers into canonical_content (availability `partially_redacted`: each
pointed-at value replaced by the `[REDACTED]` marker, everything else kept). Only canonical_content can be
targeted: actor, provenance and the other envelope fields are audit material the ledger keeps (see
docs/security.md, "What a redaction can reach").

`erase` (default true) removes the content of every earlier version of the object from content storage
(and so from every derived store), for good: it cannot be restored. `erase: false` suppresses instead: reads
and derived stores stop showing the content, content storage keeps it, and a transition back to `available`
with a restoration policy basis restores it. A suppression is compatible with a legal hold; an erasure is not.
"""

from __future__ import annotations

import copy
import re
from typing import Annotated, Any

import msgspec

from schemas.common import (
    COMMAND_STRUCT,
    Id,
    IdempotencyKey,
)
from schemas.envelope import Actor, Provenance

REDACTED_MARKER = "[REDACTED]"
MAX_POINTERS = 256
JsonPointer = Annotated[str, msgspec.Meta(max_length=2048)]
_INDEX = re.compile(r"^(0|[1-9][0-9]*)\Z")



class RedactionTarget(msgspec.Struct, **COMMAND_STRUCT):
    """What a Redact removes: all content (no pointers) or the values at these JSON Pointers."""

    pointers: Annotated[list[JsonPointer], msgspec.Meta(min_length=1, max_length=MAX_POINTERS)] | None = None
    erase: bool = True


class Redact(msgspec.Struct, tag="redact", **COMMAND_STRUCT):
    """Remove or suppress protected content, keeping the audit trail (a new, content-reduced version)."""

    scope_id: Id
    object_id: Id
    expected_version_id: Id
    actor: Actor
    provenance: Provenance
    policy_basis: Annotated[str, msgspec.Meta(min_length=1, max_length=4096)]
    redaction_target: RedactionTarget = msgspec.field(default_factory=RedactionTarget)
    idempotency_key: IdempotencyKey | None = None
    operation_id: Id | None = None


class PointerProblem(ValueError):
    """A pointer that is malformed or names nothing in the content: `pointer` and `reason` say which and why."""

    def __init__(self, pointer: str, reason: str):
        super().__init__(f"{pointer!r}: {reason}")
        self.pointer = pointer
        self.reason = reason


def pointer_tokens(pointer: str) -> list[str]:
    """The reference tokens of an RFC 6901 pointer ("" is the whole document, refused here: that is a full
    redaction). `~1` is `/` and `~0` is `~`, unescaped in that order."""
    if pointer == "":
        raise PointerProblem(pointer, "the empty pointer names the whole content: leave pointers out for a full redaction")
    if not pointer.startswith("/"):
        raise PointerProblem(pointer, "a JSON Pointer starts with '/'")
    tokens = pointer[1:].split("/")
    for token in tokens:
        rest = token.replace("~0", "").replace("~1", "")
        if "~" in rest:
            raise PointerProblem(pointer, "'~' must be escaped as '~0' (and '/' as '~1')")
    return [t.replace("~1", "/").replace("~0", "~") for t in tokens]


def redacted_projection(content: Any, pointers: list[str]) -> Any:
    """A copy of `content` with the value at every pointer replaced by REDACTED_MARKER; raises PointerProblem
    for a pointer that does not resolve (nothing is redacted then). Array indexes are decimal without leading
    zeros; `-` (past the end) names nothing."""
    for pointer in pointers:  # every pointer must name something in the content as it is
        _resolve(content, pointer)
    result = copy.deepcopy(content)
    # deepest first: "/a/b" is replaced before "/a" takes its whole value (either order of the list works)
    for pointer in sorted(set(pointers), key=lambda p: -len(pointer_tokens(p))):
        if not _resolvable(result, pointer):  # an ancestor was replaced already: nothing left to do
            continue
        tokens = pointer_tokens(pointer)
        parent = result
        for depth, token in enumerate(tokens):
            last = depth == len(tokens) - 1
            if isinstance(parent, dict):
                if token not in parent:
                    raise PointerProblem(pointer, f"no member {token!r} at depth {depth + 1}")
                if last:
                    parent[token] = REDACTED_MARKER
                else:
                    parent = parent[token]
            elif isinstance(parent, list):
                if not _INDEX.match(token) or int(token) >= len(parent):
                    raise PointerProblem(pointer, f"no array element {token!r} at depth {depth + 1}")
                if last:
                    parent[int(token)] = REDACTED_MARKER
                else:
                    parent = parent[int(token)]
            else:
                raise PointerProblem(pointer, f"a scalar has no member {token!r} (depth {depth + 1})")
    return result


def _resolve(content: Any, pointer: str) -> Any:
    """The value a pointer names in `content`; raises PointerProblem when it names none."""
    value = content
    for depth, token in enumerate(pointer_tokens(pointer)):
        if isinstance(value, dict) and token in value:
            value = value[token]
        elif isinstance(value, list) and _INDEX.match(token) and int(token) < len(value):
            value = value[int(token)]
        elif isinstance(value, (dict, list)):
            raise PointerProblem(pointer, f"no {'member' if isinstance(value, dict) else 'array element'} {token!r}"
                                          f" at depth {depth + 1}")
        else:
            raise PointerProblem(pointer, f"a scalar has no member {token!r} (depth {depth + 1})")
    return value


def _resolvable(content: Any, pointer: str) -> bool:
    try:
        _resolve(content, pointer)
    except PointerProblem:
        return False
    return True
