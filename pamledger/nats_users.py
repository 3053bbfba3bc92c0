"""The NATS users of a NATS server pamledger runs itself (authz.nats_auth), wired from the settings: written
before `up`/`run --local` start the server, completed from the ledger once it is migrated, and kept current
by the writer's process while it serves (docs/security.md, "Transport")."""

from __future__ import annotations

from typing import Any

from authz.bootstrap import admin_token_path, bootstrap_from, read_token
from authz.registry import GrantsRegistry
from authz.nats_auth import (
    NatsLogin,
    TlsFiles,
    config_path,
    configured_hashes,
    ensure_service_password,
    read_service_login,
    tls_options,
)
from authz.nats_users_sync import NatsUsers
from infra.endpoints import read_servers_file
from infra.settings import Settings


def service_login(settings: Settings) -> NatsLogin | None:
    """How the service roles log in to NATS: the state dir's service user when auth is enforced and
    `pamledger up` made one (a NATS without users ignores it), else no login."""
    if settings.auth.mode == "off":
        return None
    return read_service_login(settings.state_dir)


def operator_nats_options(settings: Settings) -> dict[str, Any]:
    """nats.connect options of the service's roles and of the operator tools on its host (status, verify,
    stream, index, which read the stream and the JetStream API): the service user's login, and TLS."""
    login = service_login(settings)
    return {**(login.options() if login is not None else {}), **tls_options(settings.auth.nats_tls_ca)}


def tls_files(settings: Settings) -> TlsFiles | None:
    cert, key = settings.auth.nats_tls_cert, settings.auth.nats_tls_key
    return TlsFiles(cert, key) if cert is not None and key is not None else None


def nats_users(settings: Settings) -> NatsUsers:
    """The state dir's NATS users as the settings say (none at all when auth is off)."""
    from local_servers.launch import reload_nats

    state_dir = settings.state_dir
    if settings.auth.mode == "off":
        return NatsUsers(state_dir, settings.subject_prefix, None, None, tls_files(settings),
                         lambda: reload_nats(state_dir))
    return NatsUsers(state_dir, settings.subject_prefix, ensure_service_password(state_dir),
                     read_token(admin_token_path(settings)), tls_files(settings), lambda: reload_nats(state_dir))


def prepare_nats_config(settings: Settings) -> None:
    """Before the local NATS starts (or is reused): a configuration it can start with. Users already written
    are kept (the ledger's credentials come with `sync_nats_users`), unless auth or TLS changed."""
    users = nats_users(settings)
    path = config_path(settings.state_dir)
    existing = path.read_text() if path.is_file() else ""
    bootstrap = users.desired(None)
    if settings.auth.mode == "off" or not configured_hashes(existing) or _tls_of(existing) != _tls_of(bootstrap):
        users.apply(bootstrap)


def _tls_of(text: str) -> Any:
    import json

    try:
        return json.loads(text).get("tls")
    except (ValueError, AttributeError):
        return None


async def sync_nats_users(settings: Settings, database_url: str) -> None:
    """Once: the users every live credential of the ledger gives, written and reloaded (what `up` does
    after migrating, so issued tokens can log in before any role runs)."""
    users = nats_users(settings)
    if settings.auth.mode == "off":
        users.apply(users.desired(None))
        return
    users.apply(users.desired(await GrantsRegistry.read_once(database_url, bootstrap_from(settings))))


def nats_is_ours(settings: Settings, nats_url: str) -> bool:
    """Whether `nats_url` is the NATS this state dir's `up`/`run --local` started (so its users are ours
    to write)."""
    recorded = read_servers_file(settings.state_dir) or {}
    return recorded.get("nats_url") == nats_url and config_path(settings.state_dir).is_file()
