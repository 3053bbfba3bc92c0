"""The grants snapshot every deciding process holds: live actor and credential records, read from the ledger's
authoritative versions of the system scope, refreshed when they change.

Why authoritative versions and not a projection: a revocation must take effect within a second whatever a
follower's backlog; the writer commits the new version and every process sees it at its next look (every
`refresh_seconds`), a cheap `max(ledger_sequence)` over the system scope's versions, reloading only when it
moved. While this process cannot refresh, the last snapshot stands for a short while (a database restart);
past `STALE_AFTER_REFRESHES` missed refreshes it is stale and the policy fails closed (service_unavailable),
since a revocation may have committed where this process cannot see it.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import msgspec
import psycopg
import structlog

from authz.policy import Grants
from schemas.auth import ACTOR_TYPE, CREDENTIAL_TYPE, ActorRecord, CredentialRecord, credential_object_id
from schemas.common import SYSTEM_SCOPE

log = structlog.get_logger(__name__)

STALE_AFTER_REFRESHES = 60  # 30 s at the default refresh of 0.5 s
# The scope is written into the statement (not a parameter) so the planner can use the partial index of
# migration 015, whose predicate names it.
_MARK = f"SELECT coalesce(max(ledger_sequence), 0) FROM memory_versions WHERE scope_id = '{SYSTEM_SCOPE}'"
_LATEST = (
    "SELECT v.object_id, v.meta, c.content FROM (SELECT DISTINCT ON (object_id) object_id, meta, content_digest"
    " FROM memory_versions WHERE scope_id = %s ORDER BY object_id, sequence DESC) v"
    " LEFT JOIN content_store c ON c.content_digest = v.content_digest"
)
_meta_decoder = msgspec.json.Decoder(dict[str, Any])
_actor_decoder = msgspec.json.Decoder(ActorRecord)
_credential_decoder = msgspec.json.Decoder(CredentialRecord)


def grants_of(rows: list[tuple[str, bytes, bytes | None]], through: int,
              bootstrap: list[tuple[CredentialRecord, ActorRecord]]) -> Grants:
    """The snapshot the latest versions of the system scope give (pure). A record is live while its object
    is available and active; a record whose object id does not match what it names is ignored, and so is one
    that would stand in for a bootstrap actor or credential, or issue a token to a bootstrap actor."""
    actors = {actor.actor_id: actor for _, actor in bootstrap}
    credentials = {credential.token_id: credential for credential, _ in bootstrap}
    reserved = set(actors) | set(credentials)
    for object_id, meta_bytes, content in rows:
        meta = _meta_decoder.decode(meta_bytes)
        if content is None or meta.get("availability_state") != "available" or meta.get("lifecycle_state") != "active":
            continue
        try:
            if meta.get("object_type") == ACTOR_TYPE:
                actor = _actor_decoder.decode(content)
                if actor.actor_id == object_id and actor.actor_id not in reserved:
                    actors[actor.actor_id] = actor
            elif meta.get("object_type") == CREDENTIAL_TYPE:
                credential = _credential_decoder.decode(content)
                if credential_object_id(credential.token_id) == object_id and credential.token_id not in reserved \
                        and credential.actor_id not in reserved:
                    credentials[credential.token_id] = credential
        except (msgspec.DecodeError, msgspec.ValidationError):  # the writer validated it: say so, never crash
            log.warning("grants.record_unreadable", object_id=object_id)
    return Grants(credentials=credentials, actors=actors, through_sequence=through)


class GrantsRegistry:
    """Holds the current Grants; `run()` keeps it fresh. `loaded` is False until the ledger was read once."""

    def __init__(self, database_url: str, bootstrap: list[tuple[CredentialRecord, ActorRecord]],
                 refresh_seconds: float = 0.5):
        self.database_url = database_url
        self.bootstrap = bootstrap
        self.refresh_seconds = refresh_seconds
        self.grants = grants_of([], 0, bootstrap)
        self.loaded = asyncio.Event()
        self.refreshed_at = 0.0  # time.monotonic() of the last refresh that read the database

    def stale(self) -> bool:
        """Loaded once, but not refreshed for STALE_AFTER_REFRESHES periods: revocations may be unseen."""
        return self.loaded.is_set() and \
            time.monotonic() - self.refreshed_at > STALE_AFTER_REFRESHES * self.refresh_seconds

    async def refresh(self, conn: psycopg.AsyncConnection[Any], quiet: bool = False) -> None:
        """Read the grants again if the system scope moved; the first load is logged (`quiet`: not, for a
        one-off look whose command prints its own output)."""
        cur = await conn.execute(_MARK)
        row = await cur.fetchone()
        through = int(row[0]) if row else 0
        self.refreshed_at = time.monotonic()
        if self.loaded.is_set() and through == self.grants.through_sequence:
            return
        cur = await conn.execute(_LATEST, (SYSTEM_SCOPE,))
        rows = [(r[0], bytes(r[1]), bytes(r[2]) if r[2] is not None else None) for r in await cur.fetchall()]
        self.grants = grants_of(rows, through, self.bootstrap)
        if not self.loaded.is_set() and not quiet:
            log.info("grants.loaded", actors=len(self.grants.actors), credentials=len(self.grants.credentials))
        self.loaded.set()

    @classmethod
    async def read_once(cls, database_url: str, bootstrap: list[tuple[CredentialRecord, ActorRecord]]) -> Grants:
        """The grants as the ledger holds them now (a one-off tool's look, no refreshing)."""
        registry = cls(database_url, bootstrap)
        async with await psycopg.AsyncConnection.connect(database_url, autocommit=True) as conn:
            await registry.refresh(conn, quiet=True)
        return registry.grants

    async def run(self) -> None:
        """Refresh forever; reconnect when the database goes away (keeping the last snapshot meanwhile)."""
        failing = False
        while True:
            try:
                async with await psycopg.AsyncConnection.connect(self.database_url, autocommit=True) as conn:
                    while True:
                        await self.refresh(conn)
                        if failing:
                            log.info("grants.refreshing_again")
                            failing = False
                        await asyncio.sleep(self.refresh_seconds)
            except Exception as exc:  # noqa: BLE001 - any failure (a lost or unmigrated database, an unreadable
                # record) is retried; the task never ends while the process serves, and `stale()` fails closed
                if not failing:
                    log.warning("grants.refresh_failed", error=type(exc).__name__)
                    failing = True
                await asyncio.sleep(self.refresh_seconds)
