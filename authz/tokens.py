"""Bearer tokens: how they look, how they are made, and how one is checked against a stored digest.

A token is `pam_<token_id>_<secret>`: 16 hex characters naming the credential (so a check looks one digest up
instead of comparing against all) and 32 random bytes, base64url. Only `sha256:<hex>` of the whole token is
ever stored; the comparison is constant-time (hmac.compare_digest). Pure: no I/O.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import re
import secrets

from schemas.auth import MAX_AUTHORIZATION_CHARS

_TOKEN = re.compile(r"pam_([a-f0-9]{16})_([A-Za-z0-9_-]{43})\Z")
_BEARER = "Bearer "


class BadCredential(ValueError):
    """The Authorization header is not `Bearer pam_<id>_<secret>`; `rule_id` says how it is wrong."""

    def __init__(self, rule_id: str, message: str):
        super().__init__(message)
        self.rule_id = rule_id


def new_token() -> tuple[str, str]:
    """A fresh (token_id, token)."""
    token_id = secrets.token_hex(8)
    secret = base64.urlsafe_b64encode(secrets.token_bytes(32)).rstrip(b"=").decode()
    return token_id, f"pam_{token_id}_{secret}"


def token_digest(token: str) -> str:
    return "sha256:" + hashlib.sha256(token.encode()).hexdigest()


def digest_matches(stored: str, token: str) -> bool:
    return hmac.compare_digest(stored.encode(), token_digest(token).encode())


def token_id_of(token: str) -> str:
    """The credential id of a well-formed token (BadCredential otherwise)."""
    match = _TOKEN.match(token)
    if match is None:
        raise BadCredential("auth.malformed_credential", "the token is not a pamledger token")
    return match.group(1)


def token_id_or_none(token: str | None) -> str | None:
    """The credential id of a well-formed token, else None."""
    try:
        return token_id_of(token) if token is not None else None
    except BadCredential:
        return None


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
