"""One soak: start the service, open the subscriptions, run the load and the kills for `duration` s, let it
settle, audit, stop the service. Returns the report (soak.report.summary)."""

from __future__ import annotations

import asyncio
import random
import shutil
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pamledger_client.client import MemoryClient
from soak import service as services
from soak.audit import run_audit, wait_quiet
from soak.chaos import TARGETS, Chaos, kill_forever
from soak.load import EVENT_FILTERS, WRITE_DEADLINE, WRITES, Record, Watched, Worker, watch
from soak.report import summary

ACTOR = {"actor_id": "actor:agent:soak", "actor_kind": "agent"}
START_TIMEOUT = 300.0
QUIET_TIMEOUT = 240.0


@dataclass
class Options:
    duration: float = 300.0
    seed: int = 1
    workers: int = 4
    scopes: int = 4
    subscriptions: int = 20
    kill_interval: float = 5.0
    targets: tuple[str, ...] = TARGETS
    space: str = "hashing-16"
    keep: bool = False


async def until(predicate: Any, timeout: float, what: str) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            value = await predicate()
        except RuntimeError:
            raise
        except Exception:  # noqa: BLE001 - not there yet
            value = None
        if value:
            return value
        await asyncio.sleep(0.25)
    raise TimeoutError(f"soak: {what} not within {timeout:.0f} s")


async def connect(service: services.Service, timeout: float = 10.0) -> MemoryClient:
    servers = service.servers() or {}
    return await MemoryClient.connect(servers["nats_url"], "pamledger", timeout=timeout, token=service.admin_token())


async def soak(options: Options) -> dict[str, Any]:
    workdir = Path(tempfile.mkdtemp(prefix="pamledger-soak-"))
    service = services.start(workdir, options.space)
    clients: list[MemoryClient] = []
    record, chaos = Record(), Chaos()
    checks: dict[str, list[str]] = {}
    try:
        await until(lambda: _ready(service), START_TIMEOUT, "every role answering status")
        probe = await connect(service, timeout=2.0)
        probe.retries = 0
        clients.append(probe)
        actor = await probe.me(ACTOR)
        scopes = [f"workspace:soak-{i}" for i in range(options.scopes)]
        for scope in scopes:
            await until(lambda scope=scope: probe.create_scope(scope), 60, f"scope {scope}")
        listeners = [await connect(service) for _ in range(2)]
        clients += listeners
        record.watched = [Watched(scopes[i % len(scopes)], EVENT_FILTERS[i % len(EVENT_FILTERS)])
                          for i in range(options.subscriptions)]
        watchers = [asyncio.create_task(watch(listeners[i % 2], w, actor, record))
                    for i, w in enumerate(record.watched)]
        await until(lambda: _all_open(record), 120, "every subscription open")

        rng = random.Random(options.seed)
        stop = asyncio.Event()
        workers = []
        for i in range(options.workers):
            client = await connect(service)
            client.retries = 0  # every failure reaches the worker: counted by code, retried with its key
            clients.append(client)
            workers.append(Worker(f"w{i}", client, scopes[i % len(scopes)], actor, record,
                                  random.Random(rng.random())))
        began = time.monotonic()
        tasks = [asyncio.create_task(w.run(stop)) for w in workers]
        killer = asyncio.create_task(kill_forever(
            chaos, service, probe, lambda: probe.query(scopes[0], limit=1), random.Random(rng.random()),
            options.kill_interval, options.targets, began, stop))
        await asyncio.sleep(options.duration)
        stop.set()
        await killer  # the last kill's recovery is measured before the quiet period starts
        try:
            await asyncio.wait_for(asyncio.gather(*tasks), timeout=WRITE_DEADLINE + 60)
        except TimeoutError:
            checks["workers finished their last write"] = [f"not within {WRITE_DEADLINE + 60:.0f} s"]
        quiet = await wait_quiet(service, record, QUIET_TIMEOUT)
        checks["quiet period (followers and subscriptions caught up)"] = (
            [] if quiet else [f"not caught up within {QUIET_TIMEOUT:.0f} s"])
        checks.update(await run_audit(service, probe, record))
        checks["every kind of write acknowledged, every target killed"] = [
            *(f"no {kind} acknowledged" for kind in WRITES if not record.operations[kind]),
            *(f"{target} never killed" for target in options.targets if not any(k.target == target
                                                                               for k in chaos.kills))]
        for task in watchers:
            task.cancel()
        await asyncio.gather(*watchers, return_exceptions=True)
        checks["pamledger run still running"] = [] if service.proc.poll() is None else [
            f"exited {service.proc.returncode}"]
    finally:
        for client in clients:
            try:
                await asyncio.wait_for(client.close(), timeout=10)
            except Exception:  # noqa: BLE001, S110 - closing is best effort
                pass
        await asyncio.to_thread(services.stop, service)
        if not options.keep:
            shutil.rmtree(workdir, ignore_errors=True)
    opts = {**vars(options), "targets": list(options.targets), "workdir": str(workdir) if options.keep else None}
    return summary(opts, chaos, record, checks)


async def _ready(service: services.Service) -> bool:
    if service.proc.poll() is not None:
        raise RuntimeError(f"pamledger run exited {service.proc.returncode}; see {service.log_path}")
    if service.servers() is None or service.admin_token() is None:
        return False
    client = await connect(service, timeout=2.0)
    try:
        from pamledger.supervisor import ROLES

        for role in ROLES:
            await client.status(role)
        return True
    finally:
        await client.close()


async def _all_open(record: Record) -> bool:
    return all(w.subscription_id for w in record.watched)
