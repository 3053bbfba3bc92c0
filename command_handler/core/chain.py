"""The ledger hash chain: each row's hash covers its sequence, its canonical event bytes and the previous hash."""

from __future__ import annotations

import hashlib

GENESIS_HASH = bytes(32)


def row_hash(prev_hash: bytes, ledger_sequence: int, event: bytes) -> bytes:
    """sha256(prev_hash || sequence as 8 big-endian bytes || event bytes)."""
    return hashlib.sha256(prev_hash + ledger_sequence.to_bytes(8, "big") + event).digest()
