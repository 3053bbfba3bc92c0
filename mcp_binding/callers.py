"""Who an MCP request acts as: one SDK client per credential, with that credential's own NATS login.

Why never one shared server credential: the service authorizes the token each request carries, so an HTTP
session can do exactly what its bearer token may, and a revoked token stops working inside an open session as
soon as the service's grants refresh (docs/security.md). Connections are made lazily and again after a loss,
so the MCP server starts and stays up while NATS or the service is away: each call then answers
service_unavailable, and the next one after recovery goes through.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field

from pamledger_client.client import MemoryClient
from pamledger_client.errors import PamspecError

Actor = dict[str, str]
# With auth off the service proves no one: the binding's writes name this actor unless told otherwise.
ANONYMOUS_ACTOR: Actor = {"actor_id": "actor:mcp:anonymous", "actor_kind": "agent"}


@dataclass(frozen=True)
class Endpoint:
    """Where the service is, and how the binding's clients behave there."""

    nats_url: str | None  # None: where the CLI looks (PAMLEDGER_NATS_URL, then the state dir), at each connect
    prefix: str = "pamledger"
    timeout: float = 10.0
    retries: int = 2  # a host waits for its tool call: fewer retries than the SDK's default of 5
    max_in_flight: int = 32  # calls of one credential at the service at once; more wait their turn


@dataclass
class Identity:
    """What the service says of a credential (query.whoami)."""

    actor: Actor
    authenticated: bool
    grants: list[dict[str, list[str]]] | None  # None: auth is off, nothing is checked


@dataclass
class Caller:
    """One credential's client and identity. `token` None: the SDK finds one (PAMLEDGER_TOKEN, state dir)."""

    endpoint: Endpoint
    token: str | None
    _client: MemoryClient | None = None
    _identity: Identity | None = None
    _verified_at: float = 0.0
    _lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    last_used: float = field(default_factory=time.monotonic)
    turns: asyncio.Semaphore = field(init=False)  # bounds this credential's calls in flight (max_in_flight)

    def __post_init__(self) -> None:
        self.turns = asyncio.Semaphore(self.endpoint.max_in_flight)

    async def client(self) -> MemoryClient:
        """The connected client, connecting (again) when there is none or it was closed."""
        self.last_used = time.monotonic()
        async with self._lock:
            if self._client is not None and self._client.nc.is_closed:
                self._client = None
            if self._client is None:
                self._client = await MemoryClient.connect(self.endpoint.nats_url, self.endpoint.prefix,
                                                          self.endpoint.timeout, token=self.token)
                self._client.retries = self.endpoint.retries
            return self._client

    async def identity(self, max_age: float = float("inf")) -> Identity:
        """Who this credential is, asked again when the answer is older than `max_age` seconds."""
        if self._identity is not None and time.monotonic() - self._verified_at <= max_age:
            return self._identity
        client = await self.client()
        found = await client.whoami()
        actor = {"actor_id": found["actor_id"], "actor_kind": found["actor_kind"]} if found.get("authenticated") \
            else ANONYMOUS_ACTOR
        self._identity = Identity(actor, bool(found.get("authenticated")), found.get("grants"))
        self._verified_at = time.monotonic()
        return self._identity

    def distrust(self, error: PamspecError) -> None:
        """After the service refused this credential itself (revoked, expired, unknown), prove it afresh next
        time instead of trusting the last proof for up to verify_seconds."""
        if error.code == "access_denied" and (error.policy_rule_id or "").startswith("auth."):
            self._identity = None

    async def actor(self) -> Actor:
        return (await self.identity()).actor

    async def reset_if_disconnected(self) -> None:
        """Drop a connection that is not up (a NATS that refuses this login now keeps it reconnecting)."""
        async with self._lock:
            if self._client is not None and not self._client.nc.is_connected:
                await _quietly_close(self._client)
                self._client = None

    async def close(self) -> None:
        async with self._lock:
            if self._client is not None:
                await _quietly_close(self._client)
                self._client = None


async def _quietly_close(client: MemoryClient) -> None:
    try:
        await asyncio.wait_for(client.nc.close(), 2.0)
    except Exception:  # noqa: BLE001 - a connection being dropped may fail to close in any way
        pass


class CallerPool:
    """The callers of an HTTP server, one per bearer token seen, verified at most `verify_seconds` ago.

    A token the service does not authenticate is refused (access_denied) and not kept; a kept caller idle for
    `idle_seconds` is closed. At most `max_callers` credentials are held at once (the oldest idle goes)."""

    def __init__(self, endpoint: Endpoint, verify_seconds: float = 1.0, idle_seconds: float = 600.0,
                 max_callers: int = 1000):
        self.endpoint = endpoint
        self.verify_seconds = verify_seconds
        self.idle_seconds = idle_seconds
        self.max_callers = max_callers
        self._callers: dict[str, Caller] = {}

    async def authenticate(self, token: str) -> Caller:
        """The caller of `token` once the service has proved it (within verify_seconds), else access_denied."""
        caller = self._callers.get(token)
        fresh = caller is None
        if caller is None:
            caller = Caller(self.endpoint, token)
        try:
            if not fresh:
                await caller.reset_if_disconnected()
            identity = await caller.identity(self.verify_seconds)
        except PamspecError as exc:
            if exc.code == "access_denied" or fresh:
                await self._forget(token, caller)
            raise
        if not identity.authenticated:
            await self._forget(token, caller)
            raise PamspecError.of("access_denied", "the service does not authenticate this token (unknown, revoked "
                                  "or expired, or the service runs with auth off)", policy_rule_id="auth.unknown_credential")
        if fresh:
            return await self._admit(token, caller)
        return caller

    async def _admit(self, token: str, caller: Caller) -> Caller:
        """Keep `caller` for `token`, unless a concurrent first request of the same token got in first: then
        that one is kept and this one's connection closed (one NATS login per credential)."""
        kept = self._callers.get(token)
        if kept is not None:
            await caller.close()
            return kept
        if len(self._callers) >= self.max_callers:
            oldest = min(self._callers, key=lambda t: self._callers[t].last_used)
            await self._forget(oldest, self._callers[oldest])
        self._callers[token] = caller
        return caller

    async def _forget(self, token: str, caller: Caller) -> None:
        if self._callers.get(token) is caller:
            del self._callers[token]
        await caller.close()

    async def sweep(self) -> int:
        """Close the callers idle for longer than idle_seconds; how many were closed."""
        now = time.monotonic()
        idle = [(t, c) for t, c in self._callers.items() if now - c.last_used > self.idle_seconds]
        for token, caller in idle:
            await self._forget(token, caller)
        return len(idle)

    async def sweep_forever(self, every: float = 30.0) -> None:
        while True:
            await asyncio.sleep(every)
            await self.sweep()

    def __len__(self) -> int:
        return len(self._callers)

    async def close(self) -> None:
        for token, caller in list(self._callers.items()):
            await self._forget(token, caller)

