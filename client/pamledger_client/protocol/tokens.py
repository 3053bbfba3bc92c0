"""pamledger bearer tokens as a client sees them: their form, their digest, and the NATS login each one is.

A token is `pam_<token_id>_<secret>`: 16 hex characters naming the credential (so a check looks one digest up
instead of comparing against all) and 32 random bytes, base64url. Only `sha256:<hex>` of the whole token is
ever stored. On a NATS that pamledger runs with users, a token logs in as user = its token id, password = the
token, and may receive only on `_INBOX.<token_id>` (docs/security.md). Pure: no I/O.
"""

from __future__ import annotations

import base64
import hashlib
import re
import secrets
import ssl
from dataclasses import dataclass
from pathlib import Path
from typing import Any

_TOKEN = re.compile(r"pam_([a-f0-9]{16})_([A-Za-z0-9_-]{43})\Z")


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


@dataclass(frozen=True)
class NatsLogin:
    """How one client logs in to NATS: user and password, and the inbox prefix its permissions allow."""

    user: str
    password: str
    inbox_prefix: str | None = None

    def options(self) -> dict[str, Any]:
        """Keyword arguments for nats.connect."""
        options: dict[str, Any] = {"user": self.user, "password": self.password}
        if self.inbox_prefix is not None:
            options["inbox_prefix"] = self.inbox_prefix.encode()
        return options


def inbox_prefix(token_id: str) -> str:
    """The only subjects an agent may receive on: `_INBOX.<token_id>` and below."""
    return f"_INBOX.{token_id}"


def agent_login(token: str) -> NatsLogin | None:
    """A pamledger token's NATS login (None when it is not a well-formed token)."""
    token_id = token_id_or_none(token)
    return NatsLogin(token_id, token, inbox_prefix(token_id)) if token_id is not None else None


BCRYPT_ROUNDS = 6


def password_hash(token: str) -> str:
    """The bcrypt of a token: its NATS password as the NATS configuration stores it. Made where the token is
    made (the service keeps only a SHA-256 digest and cannot derive one from the other). A bcrypt of a 256-bit
    random secret needs no work factor against guessing, so a low cost keeps every NATS connect cheap.
    Needs `bcrypt` (the client's `admin` extra: `pip install 'pamledger-client[admin]'`)."""
    import bcrypt  # only an administrator issuing tokens needs it: not a dependency of the client

    return bcrypt.hashpw(token.encode(), bcrypt.gensalt(BCRYPT_ROUNDS)).decode()


def tls_options(ca_file: Path | None) -> dict[str, Any]:
    """nats.connect options verifying the server against `ca_file` (a private CA, a self-signed certificate).
    None: nothing, and a server that requires TLS is verified against the system's CAs."""
    if ca_file is None:
        return {}
    return {"tls": ssl.create_default_context(cafile=str(ca_file))}
