"""Values no derived store can hold: NUL in a string, NaN or ±Infinity, nesting past a depth, lone surrogates.

Why: the ledger is the only source of truth, and an event that a projection, full-text index or replica
cannot store wedges every follower behind it. So the writer (and the query service) refuse such values at
the door, in one iterative pass over the decoded value that also measures depth (no recursion, so depth
itself cannot blow the stack; `nests_deeper` is the cheaper depth-only pass for when nothing else can be
wrong). Lone surrogates never get that far: msgspec's JSON decoder refuses a lone
`\\ud800` escape as malformed JSON, and its encoder refuses to send one; `check_text` still looks for them in
strings that arrive another way (headers). Pure: no I/O.
"""

from __future__ import annotations

import math
from typing import Any, TypeAlias

Where: TypeAlias = "tuple[Where, Any] | None"
"""Where a value sits: (where its container sits, its key or index); None for the root."""

MAX_DEPTH = 64
"""Deepest nesting of objects/arrays inside a command or query; the command object itself does not count, so
`"canonical_content": {"a": [1]}` is two levels."""


ENVELOPE_FIELDS = frozenset({
    "canonical_content", "target_canonical_content", "actor", "provenance", "integrity", "quality_signals",
    "relationship_refs", "schema_id", "target_schema_id",
    "observed_at", "asserted_at", "valid_from", "valid_until",
})
"""Command fields that become part of the Memory Version: a bad value there is invalid_object, elsewhere
(ids, keys, the command's own fields, headers) invalid_request."""


class BadValue(Exception):
    """A value a derived store cannot hold: the JSON-pointer-ish path to it and what is wrong."""

    def __init__(self, path: str, reason: str):
        super().__init__(f"{reason} at {path or '/'}")
        self.path = path or "/"
        self.reason = reason

    @property
    def code(self) -> str:
        """The PAMSPEC error code that refuses it, by the command field it sits in."""
        return "invalid_object" if top_field(self.path) in ENVELOPE_FIELDS else "invalid_request"


def top_field(path: str) -> str:
    """The first segment of a JSON-pointer-ish path (`/canonical_content/a/0` -> `canonical_content`)."""
    return path.split("/", 2)[1] if path.startswith("/") else ""


def check_value(value: Any, max_depth: int = MAX_DEPTH) -> None:
    """Raise BadValue for the first NUL in a string or key, non-finite float, or nesting past max_depth.

    `value` is plain decoded JSON (dicts, lists, str, int, float, bool, None). The walk keeps, per container,
    only a link to its parent and its key; the path string is built for the offending value alone, so the
    common case costs a type test per value.
    """
    stack: list[tuple[Any, int, Where]] = [(value, 0, None)]
    while stack:
        node, depth, where = stack.pop()
        if isinstance(node, dict):
            pairs: Any = node.items()
        elif isinstance(node, list):
            pairs = enumerate(node)
        else:
            _check_scalar(node, where)
            continue
        if depth > max_depth:
            raise BadValue(_path(where), f"nesting deeper than {max_depth} levels")
        for key, item in pairs:
            if type(key) is str and "\x00" in key:
                raise BadValue(_path((where, key)), "key holds NUL (U+0000)")
            kind = type(item)
            if kind is str:
                if "\x00" in item:
                    raise BadValue(_path((where, key)), "string holds NUL (U+0000)")
            elif kind is int or kind is bool or item is None:
                continue
            elif kind is float:
                if not math.isfinite(item):
                    raise BadValue(_path((where, key)), "NaN and Infinity are not JSON numbers")
            elif kind is dict or kind is list or isinstance(item, (dict, list)):
                stack.append((item, depth + 1, (where, key)))
            else:
                _check_scalar(item, (where, key))


def nests_deeper(value: Any, max_depth: int = MAX_DEPTH) -> bool:
    """True when value nests objects/arrays deeper than max_depth (the same count as check_value's).

    Why a second walk: when the raw JSON holds no NUL escape, depth is all that is left to check (the
    decoder refused the rest), and this walk, which looks only at containers, costs well under half of
    check_value's.
    """
    stack: list[tuple[Any, int]] = [(value, 0)]
    while stack:
        node, depth = stack.pop()
        if depth > max_depth:
            return True
        for child in node.values() if type(node) is dict else node:
            kind = type(child)
            if kind is dict or kind is list:
                stack.append((child, depth + 1))
    return False


def refusal(value: Any) -> dict[str, Any] | None:
    """The error envelope (no operation id) the service answers for value's first bad value, else None.

    Why: a client can refuse before sending what it cannot send faithfully (msgspec encodes NaN and
    ±Infinity as `null`, which the service could not tell from a real null).
    """
    try:
        check_value(value)
    except BadValue as exc:
        return {"code": exc.code, "message": str(exc), "retryable": False,
                "details": {"field": exc.path, "reason": exc.reason}}
    return None


def check_text(value: str, path: str) -> None:
    """Raise BadValue when one string that did not come through the JSON decoder (a header value) holds NUL
    or a lone surrogate."""
    if "\x00" in value:
        raise BadValue(path, "string holds NUL (U+0000)")
    if value.isascii():
        return
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise BadValue(path, "string holds a lone surrogate") from None


def _check_scalar(value: Any, where: Where) -> None:
    if isinstance(value, str):
        check_text(value, _path(where))
    elif isinstance(value, float) and not math.isfinite(value):
        raise BadValue(_path(where), "NaN and Infinity are not JSON numbers")


def _path(where: Where) -> str:
    """The JSON-pointer-ish path of a place (`/canonical_content/a/0`), built only for an error."""
    keys: list[str] = []
    while where is not None:
        where, key = where
        keys.append(_escape(str(key)))
    return "".join(f"/{key}" for key in reversed(keys)) or "/"


def _escape(key: str) -> str:
    """A key as one JSON-pointer segment (RFC 6901: `~` and `/` escaped; a NUL shown as `\\u0000`)."""
    return key.replace("~", "~0").replace("/", "~1").replace("\x00", "\\u0000")
