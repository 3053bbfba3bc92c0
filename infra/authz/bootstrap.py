"""The two credentials that exist before any ledger entry: the administrator's and the service's own.

Why outside the ledger: someone has to be allowed to register the first actor, and the service's roles (the
gateway recording subscriptions, the indexer recording its entries, the denial audit) must reach the writer
before anyone has issued them anything. Both are tokens in files of the state dir (mode 0600), made once by
`pamledger up`/`run`; only their digests are held in memory. Settings may point elsewhere (a mounted secret).
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from infra.authz.policy import ADMIN_ACTOR_ID, SERVICE_ACTOR_ID
from infra.authz.tokens import BadCredential, new_token, token_digest, token_id_of
from infra.settings import Settings
from schemas.auth import ALL_SCOPES, ActorRecord, CredentialRecord, ScopeGrant
from schemas.common import SYSTEM_SCOPE

ADMIN_ACTOR = ActorRecord(actor_id=ADMIN_ACTOR_ID, actor_kind="operator", display_name="pamledger administrator",
                          grants=[ScopeGrant(scopes=[ALL_SCOPES, SYSTEM_SCOPE], operations=["*"])])
SERVICE_ACTOR = ActorRecord(actor_id=SERVICE_ACTOR_ID, actor_kind="service", display_name="pamledger service roles")


def admin_token_path(settings: Settings) -> Path:
    return settings.auth.admin_token_file or settings.state_dir / "admin.token"


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


def ensure_token(path: Path) -> tuple[str, bool]:
    """The token in `path`, made first when absent: (token, made_now). Safe when several processes race:
    the file appears whole (written aside, then linked into place) and the first one made wins."""
    existing = read_token(path)
    if existing is not None:
        return existing, False
    path.parent.mkdir(parents=True, exist_ok=True)
    _, token = new_token()
    fd, aside = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        os.fchmod(fd, 0o600)
        os.write(fd, (token + "\n").encode())
        os.close(fd)
        try:
            os.link(aside, path)
        except FileExistsError:
            pass
    finally:
        os.unlink(aside)
    found = read_token(path)
    if found is None:
        raise RuntimeError(f"{path} exists but holds no pamledger token; remove it to have a new one made")
    return found, found == token


def bootstrap_credentials(admin_token: str | None, service_token: str | None
                          ) -> list[tuple[CredentialRecord, ActorRecord]]:
    """The credential records the two tokens stand for (digests only)."""
    made = []
    for token, actor in ((admin_token, ADMIN_ACTOR), (service_token, SERVICE_ACTOR)):
        if token is not None:
            made.append((CredentialRecord(token_id=token_id_of(token), actor_id=actor.actor_id,
                                          token_digest=token_digest(token)), actor))
    return made
