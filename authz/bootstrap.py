"""The two credentials that exist before any ledger entry: the administrator's and the service's own.

Why outside the ledger: someone has to be allowed to register the first actor, and the service's roles (the
gateway recording subscriptions, the indexer recording its entries, the denial audit) must reach the writer
before anyone has issued them anything. Both are tokens in files of the state dir (mode 0600), made once by
`pamledger up`/`run`; only their digests are held in memory. Settings may point elsewhere (a mounted secret).
"""

from __future__ import annotations

from pathlib import Path

from authz.policy import ADMIN_ACTOR_ID, SERVICE_ACTOR_ID
from authz.tokens import BadCredential, new_token, token_digest, token_id_of
from infra.private_files import ensure_private
from infra.settings import Settings
from schemas.auth import ALL_SCOPES, ActorRecord, CredentialRecord, ScopeGrant
from schemas.common import SYSTEM_SCOPE
from schemas.errors import InvalidRequest
from pamledger_client.protocol.local import ADMIN_TOKEN_FILE

ADMIN_ACTOR = ActorRecord(actor_id=ADMIN_ACTOR_ID, actor_kind="operator", display_name="pamledger administrator",
                          grants=[ScopeGrant(scopes=[ALL_SCOPES, SYSTEM_SCOPE], operations=["*"])])
SERVICE_ACTOR = ActorRecord(actor_id=SERVICE_ACTOR_ID, actor_kind="service", display_name="pamledger service roles")


def admin_token_path(settings: Settings) -> Path:
    return settings.auth.admin_token_file or settings.state_dir / ADMIN_TOKEN_FILE


def service_token_path(settings: Settings) -> Path:
    return settings.auth.service_token_file or settings.state_dir / "service.token"


def read_token(path: Path) -> str | None:
    """The token in `path`, or None when there is none (absent, unreadable or not a token)."""
    try:
        token = path.read_text().strip()
        token_id_of(token)
    except (OSError, BadCredential):
        return None
    return token


def service_token(settings: Settings) -> str | None:
    """The service credential an operator tool on the service's host sends its service commands with (None
    where auth is off); enforced without one is invalid_request saying where it was looked for."""
    if settings.auth.mode == "off":
        return None
    token = read_token(service_token_path(settings))
    if token is None:
        raise InvalidRequest(f"no service token at {service_token_path(settings)}: run where the service's state"
                             " dir is, or set PAMLEDGER_AUTH__SERVICE_TOKEN_FILE")
    return token


def ensure_token(path: Path) -> tuple[str, bool]:
    """The token in `path`, made first when absent: (token, made_now). Safe when several processes race."""
    return ensure_private(path, lambda: new_token()[1], read_token)


def bootstrap_from(settings: Settings) -> list[tuple[CredentialRecord, ActorRecord]]:
    """The bootstrap credentials whose token files the settings name and that exist (none made here)."""
    return bootstrap_credentials(read_token(admin_token_path(settings)), read_token(service_token_path(settings)))


def bootstrap_credentials(admin_token: str | None, service_token: str | None
                          ) -> list[tuple[CredentialRecord, ActorRecord]]:
    """The credential records the two tokens stand for (digests only)."""
    made = []
    for token, actor in ((admin_token, ADMIN_ACTOR), (service_token, SERVICE_ACTOR)):
        if token is not None:
            made.append((CredentialRecord(token_id=token_id_of(token), actor_id=actor.actor_id,
                                          token_digest=token_digest(token)), actor))
    return made
