"""Bearer tokens: how they look, how they are made, and how one is checked against a stored digest.

A token is `pam_<token_id>_<secret>`: 16 hex characters naming the credential (so a check looks one digest up
instead of comparing against all) and 32 random bytes, base64url. Only `sha256:<hex>` of the whole token is
ever stored; the comparison is constant-time (hmac.compare_digest). Pure: no I/O.
"""

from __future__ import annotations

import hmac

from schemas.auth import MAX_AUTHORIZATION_CHARS
# The token's form is the protocol's (the SDK makes tokens for `tokens issue`); named here too.
from pamledger_client.protocol.tokens import (
    BadCredential as BadCredential,
    new_token as new_token,
    token_digest as token_digest,
    token_id_of as token_id_of,
    token_id_or_none as token_id_or_none,
)

_BEARER = "Bearer "


def digest_matches(stored: str, token: str) -> bool:
    return hmac.compare_digest(stored.encode(), token_digest(token).encode())


def bearer_token(header: str | None) -> str:
    """The token of an `Authorization: Bearer <token>` header value (BadCredential when missing or malformed)."""
    if header is None or not header.strip():
        raise BadCredential("auth.missing_credential", "the request carries no credential (Authorization header)")
    if len(header) > MAX_AUTHORIZATION_CHARS:
        raise BadCredential("auth.malformed_credential", "the Authorization header is too long")
    if not header.startswith(_BEARER):
        raise BadCredential("auth.malformed_credential", "the Authorization header is not 'Bearer <token>'")
    token = header[len(_BEARER):].strip()
    token_id_of(token)
    return token
