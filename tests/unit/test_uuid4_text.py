"""The writer's id formatting must be exactly the standard library's version-4 UUID text."""

from __future__ import annotations

import uuid

from hypothesis import given, strategies as st

from command_handler.stamps import uuid4_text


@given(st.binary(min_size=16, max_size=16))
def test_uuid4_text_is_the_standard_library_text(random16: bytes) -> None:
    assert uuid4_text(random16) == str(uuid.UUID(bytes=random16, version=4))


def test_extreme_inputs_get_version_and_variant_bits() -> None:
    for random16 in (b"\x00" * 16, b"\xff" * 16):
        parsed = uuid.UUID(uuid4_text(random16))
        assert parsed.version == 4 and parsed.variant == uuid.RFC_4122
