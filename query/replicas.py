"""The query role's reads on streaming replicas (`database.read_urls`), with the primary as the fallback.

Each connection asked for goes to a replica that is serving, once it passes the fence (query.replica_fence:
it has replayed the primary's position at the request); else to the primary. A replica that cannot be reached
or fails a statement is `away`: a prober connects to it every `replica_retry_seconds` and, once it answers as
a replica, gives it a fresh pool and makes it `serving` again. A replica that does not reach the fence within
`replica_wait_ms` is `behind` and gets no request for `replica_retry_seconds`. `status()` says where the
last request read and why a replica is passed over (the query role's status).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Literal
from urllib.parse import urlsplit

import psycopg
import structlog
from psycopg_pool import AsyncConnectionPool, PoolTimeout

from infra.settings import DatabaseSettings
from infra.stuck import describe
from query.connections import Connections
from query.replica_fence import NotAReplica, PrimaryPosition, replay_gap

log = structlog.get_logger(__name__)

ReplicaState = Literal["starting", "serving", "behind", "away"]
ReadSource = Literal["primary", "replica"]
IS_REPLICA = b"SELECT pg_is_in_recovery()"


def shown_url(url: str) -> str:
    """host:port/database of a URL, for status and logs: never its user or password."""
    parts = urlsplit(url)
    return f"{parts.hostname or ''}:{parts.port or 5432}{parts.path}"


@dataclass
class Replica:
    """One read URL: its pool (once it answered as a replica), its state and counts."""

    url: str
    state: ReplicaState = "starting"
    pool: AsyncConnectionPool[Any] | None = None
    retry_at: float = 0.0
    reads: int = 0
    busy: int = 0  # requests the primary answered because no connection to this replica was free in time
    reason: str | None = None
    lag_bytes: int | None = None
    prober: asyncio.Task[None] | None = field(default=None, repr=False)

    def usable(self, now: float) -> bool:
        return self.pool is not None and (self.state == "serving" or (self.state == "behind" and now >= self.retry_at))

    def report(self) -> dict[str, Any]:
        return {"url": shown_url(self.url), "state": self.state, "reads": self.reads, "busy": self.busy,
                "reason": self.reason, "lag_bytes": self.lag_bytes}


class ReplicaReads:
    """`Connections` for the query role's scans: a fenced replica connection, or the primary's."""

    def __init__(self, primary: AsyncConnectionPool[Any], settings: DatabaseSettings) -> None:
        self.primary = primary
        self.settings = settings
        self.replicas = [Replica(url) for url in settings.read_urls]
        self.position = PrimaryPosition(primary)
        self.last: ReadSource | None = None
        self.primary_reads = 0
        self._turn = 0

    @property
    def wait_seconds(self) -> float:
        return self.settings.replica_wait_ms / 1000

    async def start(self) -> None:
        """Probe every replica in the background: none is read before it answered as a replica."""
        for replica in self.replicas:
            replica.prober = asyncio.create_task(self._probe_until_serving(replica))

    async def close(self) -> None:
        for replica in self.replicas:
            if replica.prober is not None:
                replica.prober.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await replica.prober
            await self._drop_pool(replica)

    def status(self) -> dict[str, Any]:
        """Where the last scan read, and each replica's state (the query role's `status`)."""
        return {"reads_from": self.last, "primary_reads": self.primary_reads,
                "replicas": [replica.report() for replica in self.replicas]}

    @contextlib.asynccontextmanager
    async def connection(self, timeout: float | None = None) -> AsyncIterator[psycopg.AsyncConnection[Any]]:
        async with contextlib.AsyncExitStack() as stack:
            replica, fenced = await self._fenced(stack)
            if replica is None or fenced is None:
                conn = await stack.enter_async_context(self.primary.connection(timeout))
                self.primary_reads += 1
                self.last = "primary"
                yield conn
                return
            replica.reads += 1
            self.last = "replica"
            try:
                yield fenced
            except psycopg.Error as exc:
                if fenced.broken:  # the replica went away mid-request: this one fails (retryable), the next
                    self._away(replica, exc)  # ones read the primary (a statement's own error leaves it serving)
                raise

    def _pick(self) -> Replica | None:
        """The next usable replica, in turn."""
        now = time.monotonic()
        for offset in range(len(self.replicas)):
            replica = self.replicas[(self._turn + offset) % len(self.replicas)]
            if replica.usable(now):
                self._turn = (self._turn + offset + 1) % len(self.replicas)
                return replica
        return None

    async def _fenced(self, stack: contextlib.AsyncExitStack
                      ) -> tuple[Replica | None, psycopg.AsyncConnection[Any] | None]:
        """A replica connection past the fence, held by `stack`; (None, None) when the primary must answer."""
        replica = self._pick()
        if replica is None or replica.pool is None:
            return None, None
        try:
            target = await self.position.read()
        except (psycopg.Error, PoolTimeout):
            return None, None  # the primary is away too: its own path answers as it can
        held = contextlib.AsyncExitStack()
        pool = replica.pool
        try:
            conn = await held.enter_async_context(pool.connection(self.wait_seconds))
            gap = await replay_gap(conn, target, self.wait_seconds)
        except PoolTimeout as exc:  # every connection busy: this request only; none at all: it cannot connect
            await _release(held)
            if pool.get_stats().get("pool_size", 0) == 0:
                self._away(replica, exc)
            else:
                replica.busy += 1
            return None, None
        except (psycopg.Error, NotAReplica) as exc:
            await _release(held)
            self._away(replica, exc)
            return None, None
        if gap > 0:
            await _release(held)
            self._behind(replica, gap)
            return None, None
        replica.state, replica.reason, replica.lag_bytes = "serving", None, 0
        await stack.enter_async_context(held)
        return replica, conn

    def _behind(self, replica: Replica, gap: int) -> None:
        if replica.state != "behind":
            log.warning("query.replica_behind", replica=shown_url(replica.url), lag_bytes=gap,
                        wait_ms=self.settings.replica_wait_ms)
        replica.state, replica.lag_bytes = "behind", gap
        replica.reason = f"had not replayed the primary's position within {self.settings.replica_wait_ms} ms"
        replica.retry_at = time.monotonic() + self.settings.replica_retry_seconds

    def _away(self, replica: Replica, exc: BaseException) -> None:
        """Stop reading `replica` and probe it until it answers again (one prober at a time)."""
        if replica.state == "away":
            return
        log.warning("query.replica_away", replica=shown_url(replica.url), reason=describe(exc))
        replica.state, replica.reason, replica.lag_bytes = "away", describe(exc), None
        if replica.prober is None or replica.prober.done():
            replica.prober = asyncio.create_task(self._probe_until_serving(replica))

    async def _probe_until_serving(self, replica: Replica) -> None:
        """Every replica_retry_seconds: connect; once the server answers as a replica, read it again through a
        fresh pool (the old one may be deep in its reconnection backoff)."""
        await self._drop_pool(replica)
        while True:
            said = replica.reason
            try:
                async with await psycopg.AsyncConnection.connect(replica.url, autocommit=True,
                                                                 connect_timeout=5) as conn:
                    row = await (await conn.execute(IS_REPLICA)).fetchone()
                if row is not None and row[0]:
                    break
                replica.reason = "not in recovery: a primary or a promoted replica is never read"
            except psycopg.Error as exc:
                replica.reason = describe(exc)
            if replica.reason != said:  # once per distinct reason, not every retry
                log.warning("query.replica_unusable", replica=shown_url(replica.url), reason=replica.reason)
            await asyncio.sleep(self.settings.replica_retry_seconds)
        pool: AsyncConnectionPool[Any] = AsyncConnectionPool(
            replica.url, min_size=1, max_size=self.settings.replica_pool_size, open=False,
            kwargs={"autocommit": True}, check=self._check_for(replica))
        await pool.open()
        replica.pool, replica.state, replica.reason = pool, "serving", None
        log.info("query.replica_serving", replica=shown_url(replica.url))

    def _check_for(self, replica: Replica) -> Callable[[psycopg.AsyncConnection[Any]], Awaitable[None]]:
        """The pool's check of a connection it lends: a dead one means the replica went away (killed,
        restarted), so the requests after it read the primary until the prober finds it back."""
        async def check(conn: psycopg.AsyncConnection[Any]) -> None:
            try:
                await AsyncConnectionPool.check_connection(conn)
            except Exception as exc:
                self._away(replica, exc)
                raise
        return check

    async def _drop_pool(self, replica: Replica) -> None:
        pool, replica.pool = replica.pool, None
        if pool is not None:
            with contextlib.suppress(Exception):
                await pool.close(timeout=1.0)


async def _release(held: contextlib.AsyncExitStack) -> None:
    """Give a replica connection back to its pool, whatever state it is in (a dead one is discarded)."""
    with contextlib.suppress(Exception):
        await held.aclose()
