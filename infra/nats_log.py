"""One log line per NATS connection state change, instead of nats-py's traceback per reconnect attempt.

Why: without an error callback nats-py logs every failed reconnect attempt with a full traceback (four a
second per role at our reconnect wait: 17 MB of log over ten minutes of NATS down). A lost server is an
expected state, not a bug: say `nats.disconnected` once, `nats.reconnected` once, and keep tracebacks for
errors nobody expected.
"""

from __future__ import annotations

import asyncio
from typing import Any

import nats.errors
import structlog
from nats.aio.client import Client

from pamledger_client.protocol.requests import abandon_requests_in_flight

log = structlog.get_logger(__name__)
# What a server going away (or not being there yet) raises: expected, a state and not a bug.
CONNECTION_ERRORS: tuple[type[BaseException], ...] = (
    OSError, asyncio.TimeoutError, nats.errors.ConnectionClosedError, nats.errors.StaleConnectionError,
    nats.errors.UnexpectedEOF, nats.errors.NoServersError, nats.errors.TimeoutError,
)


class ConnectionLog:
    """nats-py's error / disconnected / reconnected / closed callbacks for one named connection."""

    def __init__(self, name: str):
        self.name = name
        self.client: Client | None = None  # set once connected: a disconnect while closing is no news
        self.down = False  # between a disconnect (or a failed attempt) and the next reconnect
        self.failed_attempts = 0

    def callbacks(self) -> dict[str, Any]:
        """The keyword arguments of `Client.connect` that install these callbacks."""
        return {"error_cb": self.error, "disconnected_cb": self.disconnected,
                "reconnected_cb": self.reconnected, "closed_cb": self.closed}

    async def error(self, exc: Exception) -> None:
        if isinstance(exc, CONNECTION_ERRORS):
            self.failed_attempts += 1
            if not self.down:  # the first failure of an outage says why; the attempts after it are counted
                self.down = True
                log.warning("nats.connection_failed", connection=self.name, error=type(exc).__name__,
                            reason=str(exc)[:200])
            return
        log.error("nats.error_raised", connection=self.name, error=type(exc).__name__, reason=str(exc)[:200],
                  exc_info=exc)

    async def disconnected(self) -> None:
        if self.client is not None and self.client.is_closed:
            return
        if not self.down:
            self.down = True
            log.warning("nats.disconnected", connection=self.name)

    async def reconnected(self) -> None:
        abandoned = abandon_requests_in_flight(self.client) if self.client is not None else 0
        log.info("nats.reconnected", connection=self.name, failed_attempts=self.failed_attempts,
                 requests_retried=abandoned)
        self.down = False
        self.failed_attempts = 0

    async def closed(self) -> None:
        log.info("nats.closed", connection=self.name)
