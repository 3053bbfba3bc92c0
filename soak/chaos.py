"""The chaos: SIGKILL one role or server at random every few seconds and time how long it takes to come back.

A role's pid is what its status answers (the administrator sees it); a server's is in servers.json. A role is
back when its status answers again from another pid; a server when servers.json names a new pid that answers
and a request through it goes through (NATS: the writer's status; Postgres: a query).
"""

from __future__ import annotations

import asyncio
import os
import random
import signal
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from local_servers.nats_server import nats_info
from local_servers.postgres_server import postgres_answers
from pamledger_client.client import MemoryClient
from pamledger.supervisor import ROLES
from soak.service import Service

SERVERS = ("nats", "postgres")
TARGETS: tuple[str, ...] = (*ROLES, *SERVERS)
RECOVERY_TIMEOUT = 180.0


@dataclass
class Kill:
    target: str
    pid: int
    at: float  # seconds since the soak began
    recovery_seconds: float | None = None  # None: not back within RECOVERY_TIMEOUT


@dataclass
class Chaos:
    """Every kill made, in order."""

    kills: list[Kill] = field(default_factory=list)


async def pid_of(target: str, service: Service, probe: MemoryClient) -> int | None:
    """The live pid of a role (its status) or a server (servers.json); None when it does not answer now."""
    if target in SERVERS:
        recorded = service.servers()
        return None if recorded is None else int(recorded[f"{target}_pid"])
    try:
        return int((await probe.status(target))["pid"])
    except Exception:  # noqa: BLE001 - not answering (yet): no pid to kill
        return None


async def back(target: str, old_pid: int, service: Service, probe: MemoryClient,
               request: Callable[[], Awaitable[Any]]) -> bool:
    """Whether `target` answers again from a pid other than `old_pid`."""
    if target not in SERVERS:
        pid = await pid_of(target, service, probe)
        return pid is not None and pid != old_pid
    recorded = service.servers()
    if recorded is None or int(recorded[f"{target}_pid"]) == old_pid:
        return False
    alive = await asyncio.to_thread(nats_info, recorded["nats_port"]) if target == "nats" else \
        await asyncio.to_thread(postgres_answers, recorded["database_url"])
    if not alive:
        return False
    try:
        await asyncio.wait_for(request(), timeout=5)
    except Exception:  # noqa: BLE001 - the request has not gone through yet
        return False
    return True


async def kill_forever(chaos: Chaos, service: Service, probe: MemoryClient, request: Callable[[], Awaitable[Any]],
                       rng: random.Random, interval: float, targets: Sequence[str], began: float,
                       stop: asyncio.Event) -> None:
    """Until `stop`: wait about `interval` s, SIGKILL one target, wait until it is back (never two at once).
    Targets come in shuffled rounds, so every one is killed once `len(targets)` kills were made."""
    bag: list[str] = []
    while not stop.is_set():
        try:
            await asyncio.wait_for(stop.wait(), timeout=rng.uniform(0.5 * interval, 1.5 * interval))
            return
        except TimeoutError:
            pass
        if not bag:
            bag = list(targets)
            rng.shuffle(bag)
        target = bag.pop()
        pid = await pid_of(target, service, probe)
        if pid is None:
            continue
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            continue
        killed_at = time.monotonic()
        kill = Kill(target, pid, round(killed_at - began, 1))
        chaos.kills.append(kill)
        while time.monotonic() - killed_at < RECOVERY_TIMEOUT:
            if await back(target, pid, service, probe, request):
                kill.recovery_seconds = time.monotonic() - killed_at
                break
            await asyncio.sleep(0.1)
