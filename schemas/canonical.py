"""Canonical JSON (sorted keys, UTF-8, no insignificant whitespace) and digests of it.

Everything pamledger stores, hashes or returns goes through these encoders so the same value always has
the same bytes (ARCHITECTURE invariant 9).
"""

from __future__ import annotations

import hashlib
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


def salted_digest(salt: bytes, content: bytes) -> str:
    """A version's content digest: the ledger keeps it, and once salt and content are erased it reveals nothing."""
    return "sha256:" + hashlib.sha256(salt + content).hexdigest()


def sha256_digest(data: bytes) -> str:
    """The `sha256:<hex>` digest form used for content and ledger hashes."""
    return "sha256:" + hashlib.sha256(data).hexdigest()
