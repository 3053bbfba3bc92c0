"""Canonical JSON (sorted keys, UTF-8, no insignificant whitespace) and digests of it.

Everything pamledger stores, hashes or returns goes through these encoders so the same value always has
the same bytes (ARCHITECTURE invariant 9).
"""

from __future__ import annotations

import hashlib

# The encoders are the protocol's (the SDK sends the same bytes); named here too.
from pamledger_client.protocol.canonical import canonical_bytes as canonical_bytes, decode_json as decode_json


def salted_digest(salt: bytes, content: bytes) -> str:
    """A version's content digest: the ledger keeps it, and once salt and content are erased it reveals nothing."""
    return "sha256:" + hashlib.sha256(salt + content).hexdigest()


def sha256_digest(data: bytes) -> str:
    """The `sha256:<hex>` digest form used for content and ledger hashes."""
    return "sha256:" + hashlib.sha256(data).hexdigest()
