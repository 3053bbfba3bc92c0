"""The export's line rendering (schemas.bundle.version_line / event_line / vector_line,
schemas.replies.stored_envelope_bytes):
around the stored bytes, as they are, the very bytes a decoded line or envelope encodes to. Why: the service
renders a page's lines without decoding them, and a bundle's bytes (and so its digest) must stay what they were
for the same state; a deletion still shows its tombstone marker."""

from __future__ import annotations

from typing import Any

import msgspec
import pytest

from schemas.bundle import EventLine, VectorLine, VersionLine, decode_line, event_line, vector_line, version_line
from schemas.canonical import canonical_bytes, decode_json
from schemas.replies import envelope_bytes, stored_envelope_bytes

ENVELOPE: dict[str, Any] = {"object_id": "mem:1", "canonical_content": {"text": "é \"quoted\" \\ ü", "n": 1.5,
                                                                          "nested": {"z": [1, None], "a": True}},
                            "availability_state": "available", "sequence": 2}
EVENT: dict[str, Any] = {"event_type": "object_created", "payload": {"content_digest": "sha256:00"}, "sequence": 1}


@pytest.mark.parametrize("salt", ["ab" * 16, None])
def test_a_version_line_is_the_decoded_lines_bytes(salt: str | None) -> None:
    rendered = version_line(7, canonical_bytes(ENVELOPE), salt)
    assert rendered == canonical_bytes(VersionLine(ledger_sequence=7, envelope=ENVELOPE, salt=salt))
    assert decode_line(rendered) == VersionLine(ledger_sequence=7, envelope=ENVELOPE, salt=salt)


def test_an_event_line_is_the_decoded_lines_bytes() -> None:
    rendered = event_line(9, canonical_bytes(EVENT))
    assert rendered == canonical_bytes(EventLine(ledger_sequence=9, event=EVENT))
    assert decode_line(rendered) == EventLine(ledger_sequence=9, event=EVENT)


@pytest.mark.parametrize("state, content", [("available", b'{"text":"\xc3\xa9 kept"}'), ("redacted", None),
                                            ("deleted", None), ("deleted", b'{"text":"still stored"}')])
def test_an_envelope_from_stored_meta_is_the_decoded_envelope(state: str, content: bytes | None) -> None:
    meta = {key: value for key, value in ENVELOPE.items() if key != "canonical_content"} | {"availability_state": state}
    rendered, deleted = stored_envelope_bytes(canonical_bytes(meta), content)
    assert rendered == envelope_bytes(meta, content)
    assert deleted == (state == "deleted")


@pytest.mark.parametrize("stored", [b"[0.25,-1,0,1e-05,-1.17549435e-38,3.4028235e+38,0.1,-0]", b"[1]",
                                    b"[0.33333334,-0.70710677,123456.79]"])
def test_a_vector_line_is_the_line_the_client_made_from_a_page_entry(stored: bytes) -> None:
    """Before pages carried lines, an entry carried `vectors: [{..., "vector": <pgvector's text>}]` and the
    client decoded the reply and encoded VectorLine(...): the service's line is that very line."""
    page = canonical_bytes({"embedding_space_id": "space:a", "space_digest": "sha256:aa", "content_digest": "sha256:cc",
                            "vector": msgspec.Raw(stored)})
    made = canonical_bytes(VectorLine(ledger_sequence=5, object_id="mem:1", version_id="ver:1", **decode_json(page)))
    assert vector_line(5, "mem:1", "ver:1", "sha256:cc", "space:a", "sha256:aa", stored) == made
    assert isinstance(decode_line(made), VectorLine)
