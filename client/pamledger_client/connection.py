"""Find and open the NATS connection of a local pamledger service, failing fast with one clear error.

With no URL the SDK looks where the CLI looks (pamledger_client.config: PAMLEDGER_NATS_URL, then the state
dir's servers.json), so the README snippets run against `make run` as written. A dead port answers one
service_unavailable naming the URL instead of retrying forever with a traceback per attempt.
"""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path
from typing import Any

import nats
from nats.aio.client import Client as NATS

from pamledger_client.errors import PamspecError
from pamledger_client.protocol.tokens import agent_login, tls_options
from pamledger_client.protocol.requests import abandon_requests_in_flight

log = logging.getLogger("pamledger_client")

HEADER_LINE = b"NATS/1.0\r\n"


def message_size(payload: bytes, headers: dict[str, str] | None) -> int:
    """The bytes nats-server counts against max_payload: the payload plus the header block nats.py encodes.

    Why: nats.py checks the payload alone, and the server closes the connection on a message over the
    limit, losing every request in flight on it; the SDK must refuse such a message before it is sent."""
    if not headers:
        return len(payload)
    lines = sum(len(key.strip().encode()) + len(value.strip().encode()) + 4  # "key: value\r\n"
                for key, value in headers.items() if key.strip())
    return len(payload) + len(HEADER_LINE) + lines + 2  # the block ends with an empty line


_RESET_ATTEMPTS = 5


def login_options(token: str | None, tls_ca: Path | None = None) -> dict[str, Any]:
    """nats.connect options for a pamledger token: user = its token id, password = the token, and replies on
    `_INBOX.<token_id>`, the only subjects a NATS pamledger runs lets it receive on (docs/protocol.md).
    A NATS without users ignores the login. `tls_ca`: verify the server's certificate against it."""
    login = agent_login(token) if token is not None else None
    return {**(login.options() if login is not None else {}), **tls_options(tls_ca)}


async def open_nats(url: str, connect_timeout: float = 2.0, token: str | None = None,
                    tls_ca: Path | None = None, login: dict[str, Any] | None = None) -> NATS:
    """Try twice (nats.py's first connect otherwise loops forever on a dead port), then once connected
    reconnect forever, so the client rides out server restarts. With `token`, log in with it; `login`
    (nats.connect options: an operator tool's service login) replaces that."""
    options = login if login is not None else login_options(token, tls_ca)
    for attempt in range(_RESET_ATTEMPTS):
        watch = _Watch(url)
        try:
            # Bounded: nats.py retries a failing TLS handshake (an unknown certificate) without end.
            nc = await asyncio.wait_for(nats.connect(
                [server.strip() for server in url.split(",") if server.strip()],  # a cluster's nodes
                connect_timeout=max(1, round(connect_timeout)), max_reconnect_attempts=1,
                reconnect_time_wait=0.25, error_cb=watch.error, reconnected_cb=watch.reconnected, **options),
                3 * max(1, connect_timeout) + 1)
        except (OSError, TimeoutError, asyncio.TimeoutError, nats.errors.Error) as exc:
            cause = watch.last_error or exc
            if "authorization violation" in str(cause).lower():  # a login this NATS does not know (revoked?)
                raise PamspecError.of("access_denied", f"NATS at {url} refused the login: the token is unknown"
                                      " there, revoked or expired", {"nats_url": url}) from None
            # A server that refuses a login writes -ERR and closes at once: now and then the close overtakes
            # the -ERR (a reset, 3 in 40 here), which says nothing. Ask again rather than guess.
            if isinstance(cause, (ConnectionResetError, BrokenPipeError)) and attempt + 1 < _RESET_ATTEMPTS:
                continue
            raise PamspecError.of("service_unavailable", f"cannot reach NATS at {url}: {type(cause).__name__}"
                                  f" {cause}", {"nats_url": url}) from None
        nc.options["max_reconnect_attempts"] = -1  # read on every reconnect, not only at connect
        watch.connected, watch.client = True, nc
        return nc
    raise AssertionError("unreachable")


class _Watch:
    """One log line per connection state change; nats.py's default prints a traceback every 250 ms."""

    def __init__(self, url: str):
        self.url = url
        self.connected = False  # before: the connect call reports the failure itself
        self.troubled = False
        self.last_error: Exception | None = None
        self.client: NATS | None = None

    async def error(self, exc: Exception) -> None:
        self.last_error = exc
        if self.connected and not self.troubled:
            log.warning("nats %s: %s; reconnecting quietly", self.url, type(exc).__name__)
        self.troubled = True

    async def reconnected(self) -> None:
        if self.client is not None:  # replies lost with the old server: retry those requests now
            abandon_requests_in_flight(self.client)
        if self.troubled:
            log.warning("nats %s: reconnected", self.url)
        self.troubled = False
