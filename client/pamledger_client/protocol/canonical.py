"""Canonical JSON (sorted keys, UTF-8, no insignificant whitespace): the bytes the service stores, hashes and
answers, and the SDK sends. Pure: no I/O."""

from __future__ import annotations

from typing import Any

import msgspec

_encoder = msgspec.json.Encoder(order="sorted")
_decoder = msgspec.json.Decoder()


def canonical_bytes(value: Any) -> bytes:
    """Encode any msgspec-encodable value as canonical JSON bytes."""
    return _encoder.encode(value)


def decode_json(data: bytes | str) -> Any:
    """Decode JSON into plain Python values."""
    return _decoder.decode(data)
