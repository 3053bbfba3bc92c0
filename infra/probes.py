"""Each role process's HTTP side door: `/metrics` (Prometheus text), `/healthz` (alive) and `/readyz` (ready).

Why asyncio and not prometheus-client's threaded server: the readiness checks look at the roles' own
connections, which live in this event loop. Every answer is built from what the process already knows (no
request to NATS or Postgres blocks it beyond one bounded `SELECT 1`), so a probe answers in well under 50 ms.

Ready means: every NATS connection of the process is connected, Postgres answers, and no follower of the
process is stuck. Leading or standing by are both ready (a standby takes over when the leader dies); the body
says which. A port in use is logged and the process serves on without the side door.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from typing import Any

import psycopg
import structlog
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from schemas.canonical import canonical_bytes

log = structlog.get_logger(__name__)
Check = Callable[[], str | None]  # None: fine; else why not ready
POSTGRES_PROBE_SECONDS = 0.04


class Probes:
    """What `/readyz` asks: named checks the roles register, and the database to ping."""

    def __init__(self, database_url: str | None = None, details: Callable[[], dict[str, Any]] | None = None):
        self.checks: dict[str, Check] = {}
        self.database_url = database_url
        self.details = details or dict
        self._conn: psycopg.AsyncConnection[Any] | None = None

    def add(self, name: str, check: Check) -> None:
        self.checks[name] = check

    async def problems(self) -> dict[str, str]:
        found = {name: reason for name, check in self.checks.items() if (reason := check()) is not None}
        if self.database_url is not None and (reason := await self._postgres()) is not None:
            found["postgres"] = reason
        return found

    async def _postgres(self) -> str | None:
        try:
            async with asyncio.timeout(POSTGRES_PROBE_SECONDS * 10 if self._conn is None else POSTGRES_PROBE_SECONDS):
                if self._conn is None or self._conn.closed:
                    self._conn = await psycopg.AsyncConnection.connect(self.database_url or "", autocommit=True,
                                                                       connect_timeout=1)
                await self._conn.execute("SELECT 1")
            return None
        except (psycopg.Error, OSError, TimeoutError) as exc:
            await self.close()
            return type(exc).__name__

    async def close(self) -> None:
        if self._conn is not None:
            with contextlib.suppress(Exception):
                await self._conn.close()
        self._conn = None


async def _respond(probes: Probes, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        request = await asyncio.wait_for(reader.readline(), 5)
        parts = request.decode("latin-1").split()
        path = parts[1].split("?", 1)[0] if len(parts) >= 2 else ""
        if path == "/metrics":
            status, kind, body = 200, CONTENT_TYPE_LATEST, generate_latest()
        elif path == "/healthz":
            status, kind, body = 200, "application/json", canonical_bytes({"alive": True})
        elif path == "/readyz":
            problems = await probes.problems()
            status = 503 if problems else 200
            kind, body = "application/json", canonical_bytes({"ready": not problems, "problems": problems,
                                                              **probes.details()})
        else:
            status, kind, body = 404, "text/plain", b"not found: /metrics, /healthz, /readyz\n"
        reason = {200: "OK", 404: "Not Found", 503: "Service Unavailable"}[status]
        writer.write(f"HTTP/1.1 {status} {reason}\r\nContent-Type: {kind}\r\nContent-Length: {len(body)}\r\n"
                     "Connection: close\r\n\r\n".encode() + body)
        await writer.drain()
    except (OSError, asyncio.TimeoutError, ValueError):
        pass  # a client that went away, sent nothing, or a request line past the reader's limit: no answer
    finally:
        writer.close()


@contextlib.asynccontextmanager
async def serving_probes(host: str, port: int, probes: Probes) -> AsyncIterator[int | None]:
    """Serve the side door while the block runs; yields the port (None: off, or the port was taken)."""
    if port <= 0:
        yield None
        return
    try:
        server = await asyncio.start_server(lambda r, w: _respond(probes, r, w), host, port)
    except OSError as exc:
        log.warning("probes.unavailable", host=host, port=port, error=type(exc).__name__)
        yield None
        return
    log.info("probes.serving", url=f"http://{host}:{port}/metrics")
    try:
        yield port
    finally:
        server.close()
        await probes.close()
