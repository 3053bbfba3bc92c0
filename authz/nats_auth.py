"""NATS users and permissions for a NATS server pamledger runs itself (`pamledger up` / `run --local`).

Why: with an open NATS anyone who reaches it can read every reply (`_INBOX.>`), the raw ledger stream
(`{prefix}.ledger.>`, `$JS.API.>`), or join the writer's queue group and answer commands. The local server
therefore runs with a configuration (`<state_dir>/nats/nats.conf`, mode 0600) naming:

- one user for the service roles, `pamledger-service`, password in `<state_dir>/nats-service.password`
  (0600). One user and not one per role: every role reads the same state dir (service.token included, which
  already lets it send every service command), so per-role NATS users on one machine would separate
  nothing a compromised role could not read anyway. It may publish and subscribe anywhere (the JetStream API,
  the stream, the queue groups, replies).
- one user per live pamledger credential (the bootstrap admin token included): user = token_id, password =
  the whole token, stored as bcrypt. An agent may publish only to the public request subjects and subscribe
  only to its own inbox `_INBOX.<token_id>.>`, so it cannot read another's replies, the stream or the
  JetStream API, nor serve a request subject in a role's place.

The credential's bcrypt is made where the token is (tokens issue; the admin token here), since the service
keeps only a SHA-256 digest of a token and cannot derive one from the other. A bcrypt of a 256-bit random
secret needs no work factor against guessing, so a low cost keeps every NATS connect cheap.

Pure rendering here, plus the file writes; the runtime loop that keeps it current is NatsUsersSync
(authz/nats_users_sync.py).
"""

from __future__ import annotations

import json
import secrets
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import bcrypt

from authz.policy import Grants, refusal_of
from pamledger_client.protocol.tokens import (  # a token's NATS login is the protocol's: the SDK logs in
    NatsLogin as NatsLogin,
    password_hash as password_hash,
    agent_login as agent_login,
    inbox_prefix as inbox_prefix,
    tls_options as tls_options,
)
from infra.private_files import ensure_private
from pamledger_client.protocol.subjects import (
    COMMANDS, SUBSCRIPTION_CALLS, command_subject, query_subject, status_subject, subscription_subject,
)

SERVICE_USER = "pamledger-service"
SERVICE_PASSWORD_FILE = "nats-service.password"
CONFIG_FILE = "nats.conf"


def service_password_path(state_dir: Path) -> Path:
    return state_dir / SERVICE_PASSWORD_FILE


def config_path(state_dir: Path) -> Path:
    return state_dir / "nats" / CONFIG_FILE


def read_service_login(state_dir: Path) -> NatsLogin | None:
    """The service roles' login, when `pamledger up` made one for this state dir."""
    try:
        password = service_password_path(state_dir).read_text().strip()
    except OSError:
        return None
    return NatsLogin(SERVICE_USER, password) if password else None


def ensure_service_password(state_dir: Path) -> str:
    """The service user's password, made (0600) when absent; the first writer wins a race."""
    def read(path: Path) -> str | None:
        login = read_service_login(path.parent)
        return login.password if login is not None else None

    return ensure_private(service_password_path(state_dir), lambda: secrets.token_urlsafe(32), read)[0]


def hash_matches(stored: str, secret: str) -> bool:
    try:
        return bcrypt.checkpw(secret.encode(), stored.encode())
    except ValueError:
        return False


def agent_permissions(prefix: str, token_id: str) -> dict[str, Any]:
    """Publish only the public requests; receive only on the own inbox."""
    publish = [command_subject(prefix, name) for name in COMMANDS]
    publish += [query_subject(prefix, "*"), status_subject(prefix, "*")]
    publish += [subscription_subject(prefix, name) for name in SUBSCRIPTION_CALLS]
    return {"publish": {"allow": publish}, "subscribe": {"allow": [f"{inbox_prefix(token_id)}.>"]}}


SERVICE_PERMISSIONS: dict[str, Any] = {"publish": {"allow": [">"]}, "subscribe": {"allow": [">"]},
                                       "allow_responses": True}


@dataclass(frozen=True)
class AgentUser:
    token_id: str
    password_hash: str


@dataclass(frozen=True)
class TlsFiles:
    cert_file: Path
    key_file: Path


def render_config(prefix: str, service_hash: str | None, agents: list[AgentUser],
                  tls: TlsFiles | None = None) -> str:
    """The configuration nats-server reads (JSON, which its format accepts). No service hash: no
    authorization at all (auth off keeps today's open NATS)."""
    config: dict[str, Any] = {}
    if service_hash is not None:
        users = [{"user": SERVICE_USER, "password": service_hash, "permissions": SERVICE_PERMISSIONS}]
        users += [{"user": agent.token_id, "password": agent.password_hash,
                   "permissions": agent_permissions(prefix, agent.token_id)}
                  for agent in sorted(agents, key=lambda a: a.token_id)]
        config["authorization"] = {"users": users}
    if tls is not None:
        config["tls"] = {"cert_file": str(tls.cert_file), "key_file": str(tls.key_file)}
    return json.dumps(config, indent=2, sort_keys=True) + "\n"


def configured_hashes(text: str) -> dict[str, str]:
    """user -> password hash of a configuration render_config wrote (empty when unreadable)."""
    try:
        users = json.loads(text).get("authorization", {}).get("users", [])
        return {str(u["user"]): str(u["password"]) for u in users}
    except (ValueError, AttributeError, KeyError, TypeError):
        return {}


def live_agents(grants: Grants, now: datetime, skip: set[str], known: dict[str, str]) -> list[AgentUser]:
    """The NATS users the grants snapshot's credentials give: live as the policy sees them, with a bcrypt to
    check against (`nats_password_hash` in its record, or `known` for the bootstrap tokens)."""
    agents = []
    for token_id, credential in grants.credentials.items():
        if token_id in skip or refusal_of(grants, credential, now) is not None:
            continue
        hashed = known.get(token_id) or credential.nats_password_hash
        if hashed:
            agents.append(AgentUser(token_id, hashed))
    return agents


