"""Keep a local NATS server's users in step with the live credentials: rewrite its configuration and make it
reload (SIGHUP) when they change, so `pamledger tokens issue/revoke` takes effect on the transport too.

Why a poll of the grants snapshot: it is what every deciding process already holds (authz.registry),
refreshed every `auth.refresh_seconds`; a revoked token loses its NATS user within about that plus one
reload. Only for a NATS pamledger started itself (the state dir's servers.json names it): a NATS run by
someone else is configured by them. Several processes may run this at once: each compares against the file
on disk and keeps the bcrypt already written for a bootstrap secret, so they agree and nothing flaps.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from datetime import datetime, timezone
from pathlib import Path

import structlog

from authz.policy import SERVICE_ACTOR_ID, Grants
from authz.tokens import token_id_or_none
from authz.nats_auth import (
    SERVICE_USER,
    AgentUser,
    TlsFiles,
    config_path,
    configured_hashes,
    hash_matches,
    live_agents,
    password_hash,
    render_config,
)
from infra.private_files import write_private

log = structlog.get_logger(__name__)


class NatsUsers:
    """The configuration a state dir's NATS should run with, and applying it (write, then reload)."""

    def __init__(self, state_dir: Path, prefix: str, service_password: str | None, admin_token: str | None,
                 tls: TlsFiles | None = None, reload: Callable[[], bool] | None = None):
        self.path = config_path(state_dir)
        self.prefix = prefix
        self.service_password = service_password  # None: auth off, no users at all
        self.admin_token = admin_token
        self.tls = tls
        self.reload = reload
        self._hashes: dict[str, str] = {}  # user -> a bcrypt known to match its secret (bootstrap only)
        self._rejected: set[str] = set()  # hashes found in the file that match no secret of ours

    def _hash_of(self, user: str, secret: str, written: dict[str, str]) -> str:
        """A bcrypt of `secret`: the one the file holds whenever it matches, so that processes writing the
        same file adopt each other's salt instead of rewriting (and reloading) in turn. Each hash is checked
        once."""
        existing = written.get(user)
        if existing and existing != self._hashes.get(user) and existing not in self._rejected:
            if hash_matches(existing, secret):
                self._hashes[user] = existing
            else:
                self._rejected.add(existing)
        if user not in self._hashes:
            self._hashes[user] = password_hash(secret)
        return self._hashes[user]

    def desired(self, grants: Grants | None, now: datetime | None = None) -> str:
        """The configuration for these grants (None: only the bootstrap users, before the ledger is read)."""
        if self.service_password is None:
            return render_config(self.prefix, None, [], self.tls)
        written = configured_hashes(self._read())
        service_hash = self._hash_of(SERVICE_USER, self.service_password, written)
        known: dict[str, str] = {}
        admin_id = token_id_or_none(self.admin_token)
        if self.admin_token is not None and admin_id is not None:
            known[admin_id] = self._hash_of(admin_id, self.admin_token, written)
        if grants is None:
            return render_config(self.prefix, service_hash, [AgentUser(t, h) for t, h in known.items()], self.tls)
        service_ids = {t for t, c in grants.credentials.items() if c.actor_id == SERVICE_ACTOR_ID}
        agents = live_agents(grants, now or datetime.now(timezone.utc), service_ids, known)
        return render_config(self.prefix, service_hash, agents, self.tls)

    def apply(self, text: str) -> bool:
        """Write `text` when it differs from the file, then ask the server to reload; True when it changed."""
        if not write_private(self.path, text):
            return False
        reloaded = self.reload() if self.reload is not None else False
        log.info("nats.users_written", path=str(self.path), reloaded=reloaded)
        return True

    def _read(self) -> str:
        try:
            return self.path.read_text()
        except OSError:
            return ""

    async def run(self, current: Callable[[], Grants | None], every: float) -> None:
        """Apply the configuration `current()` grants give, every `every` seconds, forever."""
        while True:
            grants = current()
            if grants is not None:
                try:
                    self.apply(self.desired(grants))
                except Exception as exc:  # noqa: BLE001 - a bad write or record must not end the sync: retried
                    log.warning("nats.users_not_written", path=str(self.path), error=type(exc).__name__)
            await asyncio.sleep(every)

