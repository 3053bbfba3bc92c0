"""Subscribe plumbing: the real service on a given database, waiting for relay and projector, the echo baseline.

`service_on` starts `python -m pamledger run` (writer + relay + projector + query + Subscribe gateway)
on a database that may already hold a bulk-loaded ledger and has no JetStream replica yet: the relay
then creates the stream and republishes every ledger row from Postgres, exactly as after losing the
stream. `wait_settled` waits (bounded) until the writer reports `relayed_sequence` at the head and the
projector's checkpoint has caught up too, so no background catch-up competes with a measurement.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncGenerator, Callable
from pathlib import Path
from typing import Any, cast
from urllib.parse import urlsplit

import msgspec
import psutil  # type: ignore[import-untyped]
import psycopg
from psycopg.conninfo import conninfo_to_dict
from nats.aio.client import Client as NATS

from bench import service
from bench.procs import Child
from bench.servers import Servers
from pamledger_client.protocol import tasks
from pamledger_client.protocol.subjects import status_subject

Log = Callable[[str], None]


async def connect(url: str, name: str = "pamledger-bench-m3") -> NATS:
    """A bench-side NATS connection: large pending limits, no reconnects (a lost server fails the run)."""
    return await service.connect(url, name, pending_mib=256)


def listener_pid(url: str) -> int | None:
    """The pid listening on a URL's loopback port (the private Postgres daemonizes, so it is no child)."""
    port = urlsplit(url).port or conninfo_to_dict(url).get("port")
    try:
        for conn in psutil.net_connections(kind="tcp"):
            if conn.status == psutil.CONN_LISTEN and conn.laddr and str(conn.laddr.port) == str(port):
                return int(conn.pid) if conn.pid else None
    except (psutil.Error, OSError):
        return None
    return None


async def idle_cpu(child: Child, nats_pid: int | None, seconds: float) -> dict[str, float]:
    """CPU share (cores) of the service and of nats-server over `seconds` with no creates flowing."""
    server = psutil.Process(nats_pid) if nats_pid else None

    def nats_cpu() -> float:
        if server is None:
            return float("nan")
        times = server.cpu_times()
        return float(times.user + times.system)

    c0, n0, t0 = child.cpu_seconds(), nats_cpu(), time.monotonic()
    await asyncio.sleep(seconds)
    wall = time.monotonic() - t0
    return {"service": round((child.cpu_seconds() - c0) / wall, 2), "nats_server": round((nats_cpu() - n0) / wall, 2)}


class LogWatch:
    """Counts lines matching patterns that a log file gains after this object is made (bounded read)."""

    def __init__(self, path: Path):
        self.path = path
        self.offset = path.stat().st_size if path.exists() else 0

    def count(self, patterns: dict[str, str], limit: int = 64 << 20) -> dict[str, int]:
        """{name: lines containing pattern (case-insensitive)} among the new lines."""
        if not self.path.exists():
            return {name: 0 for name in patterns}
        with self.path.open("rb") as f:
            f.seek(self.offset)
            text = f.read(limit).decode(errors="replace").lower()
        return {name: sum(1 for line in text.splitlines() if needle.lower() in line)
                for name, needle in patterns.items()}


NATS_LOG_SIGNS = {"slow_consumer_disconnects": "Slow Consumer Detected"}
SERVICE_LOG_SIGNS = {"nats_client_errors": "nats: encountered error", "relay_publish_failed": "relay.publish_failed",
                     "pump_retrying": "subscription.pump_retrying", "reattach_failed": "subscription.reattach_failed"}


def log_watches(servers: Servers, child: Child) -> tuple[LogWatch, LogWatch]:
    """Watches on the private nats-server's log (if any) and the service's log, from now on."""
    return LogWatch(servers.work_dir / "nats" / "nats-server.log"), LogWatch(child.log_path)


def log_signs(watches: tuple[LogWatch, LogWatch]) -> dict[str, int]:
    return {**watches[0].count(NATS_LOG_SIGNS), **watches[1].count(SERVICE_LOG_SIGNS)}


service_on = service.service_process  # (servers, database_url, label, extra_env) -> (nc, prefix, stream, child)


def sdk_events(subscription: Any) -> AsyncGenerator[dict[str, Any], None]:
    """The SDK's `async for` iterator (an async generator), typed so it can be closed deterministically."""
    return cast(AsyncGenerator[dict[str, Any], None], subscription.__aiter__())


async def stop_task(task: asyncio.Task[Any]) -> None:
    """Stop a task iterating an SDK subscription (bounded: 40 x 0.25 s); a failure after the
    measurement is retrieved, not reported."""
    await tasks.stop_task(task, attempts=40)


async def writer_status(nc: NATS, prefix: str) -> dict[str, Any]:
    msg = await nc.request(status_subject(prefix, "writer"), b"{}", timeout=10)
    return msgspec.json.decode(msg.data)["result"]  # type: ignore[no-any-return]


async def projector_checkpoint(database_url: str) -> int:
    async with await psycopg.AsyncConnection.connect(database_url, autocommit=True) as conn:
        cur = await conn.execute("SELECT coalesce(max(ledger_sequence), 0) FROM projection_checkpoints")
        row = await cur.fetchone()
        return int(row[0]) if row else 0


async def wait_settled(nc: NATS, prefix: str, database_url: str, head: int, child: Child, log: Log,
                       timeout: float = 900.0) -> dict[str, float]:
    """Wait until the relay published and the projector applied everything up to `head`; seconds each."""
    began = time.perf_counter()
    deadline = began + timeout
    relayed_at: float | None = None
    last_note = began
    while time.perf_counter() < deadline:
        if not child.alive():
            raise RuntimeError(f"{child.name} exited while catching up:\n{child.log_tail()}")
        relayed = int((await writer_status(nc, prefix))["relayed_sequence"])
        if relayed >= head and relayed_at is None:
            relayed_at = time.perf_counter() - began
        projected = await projector_checkpoint(database_url)
        if relayed_at is not None and projected >= head:
            return {"relay_seconds": round(relayed_at, 2), "settled_seconds": round(time.perf_counter() - began, 2)}
        if time.perf_counter() - last_note >= 10:
            last_note = time.perf_counter()
            log(f"catch-up: relay at {relayed:,}, projector at {projected:,} of {head:,}")
        await asyncio.sleep(0.2)
    raise TimeoutError(f"relay/projector did not reach {head} within {timeout:g} s:\n{child.log_tail()}")


