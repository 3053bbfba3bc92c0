"""The preprocessing profile pamledger-text-v1: which text each object contributes, normalised and bounded.

Why a table: the profile is part of every space's descriptor; each rule of embedding.text_profile's docstring
has a row here, so a change to a rule is a visible change to a test.
"""

from __future__ import annotations

from typing import Any

import pytest

from embedding.text_profile import MAX_CHARS, MAX_DEPTH, MAX_LEAVES, Prepared, prepare

CASES: list[tuple[str, str, Any, str]] = [
    ("claim", "claim", {"statement": "Memory persists.", "confidence": 0.9}, "Memory persists."),
    ("claim fields in table order", "claim",
     {"summary": "S", "title": "T", "statement": "Stmt"}, "Stmt\nT\nS"),
    ("decision", "decision", {"decision": "Use immutable versions.", "previous_version_id": "ver:d:1"},
     "Use immutable versions."),
    ("decision summary", "decision", {"summary": "Approve deployment to staging."},
     "Approve deployment to staging."),
    ("observation", "observation", {"observation": "Disk at 91%", "host": "db1"}, "Disk at 91%"),
    ("summary", "summary", {"summary": "Week in review"}, "Week in review"),
    ("task", "task", {"title": "Define profiles.", "description": "conformance"}, "Define profiles.\nconformance"),
    ("typed field not a string falls back", "claim", {"statement": 3, "note": "n"}, "n"),
    ("no typed field: generic leaves", "claim", {"b": "second", "a": "first"}, "first\nsecond"),
    ("unknown type: sorted keys, nested", "x-note",
     {"z": ["a", {"k": "b"}], "m": {"y": "c", "x": "d"}, "n": 1, "t": True, "u": None}, "d\nc\na\nb"),
    ("string content", "artifact", "urn:artifact:diagram", "urn:artifact:diagram"),
    ("number content", "artifact", 42, ""),
    ("tombstone", "claim", {"tombstone": True}, ""),
    ("whitespace collapsed", "claim", {"statement": "  a \n\t b  "}, "a b"),
    ("empty pieces dropped", "claim", {"statement": "x", "title": "   "}, "x"),
    ("NFC", "claim", {"statement": "cafe\u0301"}, "caf\u00e9"),
]


@pytest.mark.parametrize(("object_type", "content", "text"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_profile(object_type: str, content: Any, text: str) -> None:
    assert prepare(object_type, content) == Prepared(text, truncated=False)


def test_long_text_is_cut_and_says_so() -> None:
    got = prepare("claim", {"statement": "x" * (MAX_CHARS + 10)})
    assert got == Prepared("x" * MAX_CHARS, truncated=True)


def test_exactly_the_bound_is_not_truncated() -> None:
    assert prepare("claim", {"statement": "y" * MAX_CHARS}).truncated is False


def test_leaves_are_bounded() -> None:
    got = prepare("x-list", [str(i) for i in range(MAX_LEAVES + 50)])
    assert got.text.split("\n") == [str(i) for i in range(MAX_LEAVES)]


def test_depth_is_bounded() -> None:
    deep: Any = "hidden"
    for _ in range(MAX_DEPTH + 5):
        deep = {"k": deep}
    assert prepare("x-deep", {"top": "shown", "deep": deep}).text == "shown"
