"""The one way benchmarks run the real service: `python -m pamledger run` in its own process.

Every benchmark (write_path, projection, subscribe, ...) starts it here, with private subject prefix and
stream names, waits until it answers, and always stops it and deletes its stream afterwards.
"""

from __future__ import annotations

import asyncio
import contextlib
import sys
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable

import nats
from nats.aio.client import Client as NATS
from nats.js.errors import NotFoundError

from bench.load import Result, check_echo, drive
from bench.procs import Child, python_child, wait_answering
from bench.servers import Servers
from pamledger_client.protocol.subjects import status_subject

Prepare = Callable[[NATS, str, str], Awaitable[None]]


async def connect(url: str, name: str = "pamledger-bench", pending_mib: int = 64) -> NATS:
    """A bench-side NATS connection: large pending limits, no reconnects (a lost server fails the run)."""
    return await nats.connect(url, name=name, pending_size=pending_mib * 1024 * 1024, max_reconnect_attempts=0,
                              connect_timeout=5)


def service_names(label: str) -> tuple[str, str]:
    """A private subject prefix and stream name, so concurrent runs never share subjects."""
    tag = uuid.uuid4().hex[:8]
    return f"bench_{label}_{tag}", f"BENCH_{label.upper()}_{tag.upper()}"


@contextlib.asynccontextmanager
async def echo_service(servers: Servers, label: str, children: list[Child] | None = None
                       ) -> AsyncIterator[tuple[NATS, str]]:
    """(nc, subject) of a running bench.echo child: the NATS-only baseline every suite measures against.
    `children`, when given, receives the child (for its CPU)."""
    subject = f"bench_{label}_{uuid.uuid4().hex[:8]}.echo"
    child = python_child(f"echo-{label}", "bench.echo", {}, servers.work_dir, servers.nats_url, subject)
    if children is not None:
        children.append(child)
    nc = await connect(servers.nats_url)
    try:
        child.start()
        await wait_answering(nc, child, subject)
        yield nc, subject
    finally:
        child.stop()
        await nc.close()


async def serial_echo(servers: Servers, label: str, payload: bytes, seconds: float) -> Result:
    """Serial request/reply round trips with `payload` to bench.echo: the NATS floor of this machine."""
    async with echo_service(servers, label) as (nc, subject):
        return await drive(nc, subject, "NATS echo, serial", lambda i: (payload, None), check_echo, 1, 0.5, seconds)


@contextlib.asynccontextmanager
async def service_process(servers: Servers, database_url: str, label: str, extra_env: dict[str, str] | None = None,
                          prepare: Prepare | None = None, answering: tuple[str, ...] = ("writer", "query", "projector", "gateway"),
                          timeout: float = 120.0, roles: str = "all") -> AsyncIterator[tuple[NATS, str, str, Child]]:
    """(nc, prefix, stream, child) for the service on `database_url`. `prepare(nc, prefix, stream)` runs
    before the process starts; `answering` names the status subjects to wait for; `roles` is `run --roles`."""
    prefix, stream = service_names(label)
    child = python_child(f"pamledger-{label}", "pamledger", {
        "PAMLEDGER_NATS_URL": servers.nats_url, "PAMLEDGER_DATABASE_URL": database_url,
        "PAMLEDGER_SUBJECT_PREFIX": prefix, "PAMLEDGER_STREAM_NAME": stream, "PAMLEDGER_LOG_FORMAT": "json",
        # The bench's load carries no credential: auth is off unless a suite turns it on (bench/auth.py);
        # the bootstrap tokens `run` makes go to the scratch dir, never the project's .pamledger/.
        "PAMLEDGER_AUTH__MODE": "off", "PAMLEDGER_STATE_DIR": str(servers.work_dir / f"state-{prefix}"),
        **(extra_env or {}),
    }, servers.work_dir, "run", *(("--roles", roles) if roles != "all" else ()))
    nc = await connect(servers.nats_url)
    try:
        if prepare is not None:
            await prepare(nc, prefix, stream)
        child.start()
        for component in answering:
            await wait_answering(nc, child, status_subject(prefix, component), timeout=timeout)
        yield nc, prefix, stream, child
        if not child.alive():
            raise RuntimeError(f"{child.name} died during the run:\n{child.log_tail()}")
    finally:
        child.stop()
        if child.killed:
            print(f"bench: WARNING {child.name} ignored SIGTERM for 10 s and was killed", file=sys.stderr)
        with contextlib.suppress(NotFoundError, nats.errors.Error, TimeoutError, asyncio.TimeoutError):
            await nc.jetstream().delete_stream(stream)
        with contextlib.suppress(Exception):
            await nc.close()
