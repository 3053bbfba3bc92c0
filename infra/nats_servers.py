"""The NATS servers a URL setting names: one URL, or a cluster's nodes comma-separated.

Why in the kernel: every role, the CLI and the SDK connect with the same list (nats-py fails over between
them), and the relay sizes the stream's replicas from it. PAMLEDGER_NATS_URL and servers.json carry the
list as one comma-separated string, so it passes through environments and settings unchanged. `greeting`
probes one node alone (`pamledger status` reports every node of a cluster).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

MAX_DEFAULT_REPLICAS = 3
DEFAULT_PORT = 4222


@dataclass(frozen=True)
class StreamReplicas:
    """The copies the ledger stream should keep. `exact` (nats.stream_replicas set): made so, up or down.
    Derived from the servers named: at least so, never fewer than the stream has (a client given one node
    of a cluster must not shrink its R3 stream to R1)."""

    count: int
    exact: bool = False

    def wanted(self, current: int) -> int:
        return self.count if self.exact else max(self.count, current)


def server_urls(url: str) -> list[str]:
    """`nats://a:4222,nats://b:4222` as ["nats://a:4222", "nats://b:4222"] (blanks dropped)."""
    return [part.strip() for part in url.split(",") if part.strip()]


def stream_replicas(url: str, configured: int | None) -> StreamReplicas:
    """The ledger stream's num_replicas: as configured, else one per server named, at most 3 (a cluster's
    usual R3; more copies cost every publish an acknowledgement from more nodes)."""
    if configured is not None:
        return StreamReplicas(configured, exact=True)
    return StreamReplicas(max(1, min(len(server_urls(url)), MAX_DEFAULT_REPLICAS)))


def shown_nats_url(url: str) -> str:
    """scheme://host:port of a server URL, for status and logs: never its user, password or token."""
    parts = urlsplit(url if "://" in url else f"nats://{url}")
    return f"{parts.scheme}://{parts.hostname or ''}:{parts.port or DEFAULT_PORT}"


async def greeting(url: str, timeout: float = 2.0) -> dict[str, Any] | None:
    """The INFO a NATS server at `url` greets every connection with (server_name, version, jetstream ...),
    None when nothing greets within `timeout`. No login: a node that greets is up, whatever its users."""
    parts = urlsplit(url if "://" in url else f"nats://{url}")
    try:
        reader, writer = await asyncio.wait_for(
            asyncio.open_connection(parts.hostname or "127.0.0.1", parts.port or DEFAULT_PORT), timeout)
    except (OSError, asyncio.TimeoutError):
        return None
    try:
        line = await asyncio.wait_for(reader.readline(), timeout)
    except (OSError, asyncio.TimeoutError):
        return None
    finally:
        writer.close()
        with contextlib.suppress(OSError):
            await writer.wait_closed()
    if not line.startswith(b"INFO "):
        return None
    try:
        info = json.loads(line[5:])
    except ValueError:
        return None
    return info if isinstance(info, dict) else None
