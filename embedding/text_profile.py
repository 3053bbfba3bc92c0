"""The preprocessing profile `pamledger-text-v1`: the text a memory object contributes to an embedding.

Why a named, pure profile: a vector means something only together with the text it was made from, so the
choice of fields, the normalisation and the truncation are part of the Embedding Space descriptor (its
`preprocessing_profile`) and never change silently; truncation is reported, never hidden.

Rules, in order:
1. Typed fields: for a standard type in TYPE_FIELDS whose canonical_content is an object, the string values
   of the listed fields, in the listed order.
2. Generic fallback (another type, none of the listed fields present, or non-object content): the string
   leaves of canonical_content, walked in sorted key order (the canonical JSON order), array items in order,
   at most MAX_LEAVES leaves and MAX_DEPTH levels; a string content is its own text. Numbers, booleans and
   nulls contribute nothing.
3. Each piece is NFC-normalised and its whitespace runs collapsed to one space; empty pieces are dropped and
   the rest joined with a newline.
4. The text is cut at MAX_CHARS characters (`truncated` says so). The embedder's own window (for MiniLM,
   256 word pieces) may cut further; the embedder reports that too.
An object whose text is empty (a tombstone, content without strings) contributes no vector.
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Iterator
from typing import Any

import msgspec

PROFILE_ID = "pamledger-text-v1"
MAX_CHARS = 4096
MAX_LEAVES = 256
MAX_DEPTH = 16

TYPE_FIELDS: dict[str, tuple[str, ...]] = {
    "claim": ("statement", "title", "summary"),
    "observation": ("observation", "statement", "text", "summary"),
    "summary": ("summary", "text"),
    "decision": ("decision", "summary", "rationale"),
    "task": ("title", "description"),
    "artifact": ("title", "description"),
    "entity": ("name", "description"),
    "tool_invocation": ("tool_name", "invocation_reason"),
    "working_memory": ("purpose", "task_ref"),
}

_SPACES = re.compile(r"\s+")


class Prepared(msgspec.Struct, frozen=True):
    """The text an object contributes, and whether the profile cut it."""

    text: str
    truncated: bool


def clean(piece: str) -> str:
    """NFC-normalise and collapse whitespace runs (rule 3)."""
    return _SPACES.sub(" ", unicodedata.normalize("NFC", piece)).strip()


def string_leaves(value: Any, depth: int = 0) -> Iterator[str]:
    """The string leaves of a JSON value in canonical order (rule 2), not deeper than MAX_DEPTH."""
    if isinstance(value, str):
        yield value
    elif depth >= MAX_DEPTH:
        return
    elif isinstance(value, dict):
        for key in sorted(value):
            yield from string_leaves(value[key], depth + 1)
    elif isinstance(value, list):
        for item in value:
            yield from string_leaves(item, depth + 1)


def pieces(object_type: str, content: Any) -> list[str]:
    """The raw pieces of text by rule 1, else rule 2."""
    fields = TYPE_FIELDS.get(object_type, ())
    if isinstance(content, dict):
        typed = [content[f] for f in fields if isinstance(content.get(f), str)]
        if typed:
            return typed
    found: list[str] = []
    for leaf in string_leaves(content):
        if len(found) == MAX_LEAVES:
            break
        found.append(leaf)
    return found


def prepare(object_type: str, content: Any) -> Prepared:
    """Apply the profile to one object's type and canonical_content."""
    text = "\n".join(p for p in map(clean, pieces(object_type, content)) if p)
    if len(text) > MAX_CHARS:
        return Prepared(text[:MAX_CHARS].rstrip(), truncated=True)
    return Prepared(text, truncated=False)
