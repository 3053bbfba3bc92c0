"""`python -m bench mcp`: what the MCP binding costs over the SDK it is built on (issue [B1], "Speed").

One run, one real service (`pamledger run`, auth enforced, a bench actor with its own token), and in that run:
- read p50, serial: the SDK's `read` against `pamspec.read` through `pamledger mcp` over stdio (a subprocess
  driven by the official MCP client). Target: MCP / SDK <= 1.5.
- creates per second, 8 at once: 8 SDK clients each creating back to back, against 8 streamable-HTTP sessions
  of one `pamledger mcp --transport http` each calling `pamspec.create` back to back. Target: MCP / SDK >= 0.5.
- memory per idle HTTP session: the HTTP server's RSS before and after opening N sessions that then sit idle.
Both sides of each ratio run in the same process tree within seconds of each other; the machine's noise cancels.

    .venv/bin/python -m bench mcp                 # 10 s per throughput window, 2,000 reads
    .venv/bin/python -m bench mcp --quick         # a smoke test
    .venv/bin/python -m bench mcp --json mcp.json
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import statistics
import sys
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import psutil  # type: ignore[import-untyped]

from authz.bootstrap import read_token
from bench.load import SCOPE_ID
from bench.servers import Servers, bench_servers
from bench.service import service_process
from infra.logging import configure_logging
from mcp_binding.launch import HttpProcess, http_session
from pamledger_client.admin import issue_token, parse_grant, put_actor
from pamledger_client.client import MemoryClient

ACTOR = {"actor_id": "actor:bench:mcp", "actor_kind": "agent"}
CLIENTS = 8
TARGETS = {"read_p50_ratio": 1.5, "create_rate_ratio": 0.5}


def log(text: str) -> None:
    print(f"bench mcp: {text}", file=sys.stderr, flush=True)


@contextlib.asynccontextmanager
async def service(servers: Servers) -> AsyncIterator[tuple[dict[str, str], str, Any]]:
    """(environment for an MCP server or SDK client of it, the bench actor's token, the service's process)
    on a fresh service."""
    db_name, db_url = servers.fresh_database("mcp")
    secrets = servers.work_dir / f"secrets-mcp-{uuid.uuid4().hex[:8]}"
    env = {"PAMLEDGER_AUTH__MODE": "enforce", "PAMLEDGER_AUTH__ADMIN_TOKEN_FILE": str(secrets / "admin.token"),
           "PAMLEDGER_AUTH__SERVICE_TOKEN_FILE": str(secrets / "service.token"),
           "PAMLEDGER_INDEXER__DEFAULT_SPACE": "hashing-384"}
    try:
        async with service_process(servers, db_url, "mcp", env) as (nc, prefix, _stream, child):
            admin_token = read_token(secrets / "admin.token")
            assert admin_token is not None, f"the service made no admin token in {secrets}"
            admin = MemoryClient(nc, prefix, timeout=10.0, token=admin_token)
            await admin.create_scope(SCOPE_ID)
            await put_actor(admin, ACTOR["actor_id"], ACTOR["actor_kind"], [parse_grant(f"{SCOPE_ID}=*")])
            token = (await issue_token(admin, ACTOR["actor_id"], label="bench-mcp"))["token"]
            yield {"PAMLEDGER_NATS_URL": servers.nats_url, "PAMLEDGER_SUBJECT_PREFIX": prefix,
                   "PAMLEDGER_AUTH__MODE": "enforce", "PAMLEDGER_LOG_LEVEL": "warning",
                   "PAMLEDGER_STATE_DIR": str(secrets)}, token, child
    finally:
        servers.drop_database(db_name)


async def sdk(environment: dict[str, str], token: str) -> MemoryClient:
    client = await MemoryClient.connect(environment["PAMLEDGER_NATS_URL"], environment["PAMLEDGER_SUBJECT_PREFIX"],
                                        token=token)
    client.actor = ACTOR
    return client


def body(i: int, tag: str) -> dict[str, Any]:
    return {"scope_id": SCOPE_ID, "object_type": "claim", "canonical_content": {"statement": f"bench {tag} {i}"}}


async def timed(n: int, one: Callable[[], Awaitable[Any]]) -> list[float]:
    """`n` calls one after another after 50 unmeasured ones; seconds per call."""
    for _ in range(50):
        await one()
    out = []
    for _ in range(n):
        t0 = time.perf_counter()
        await one()
        out.append(time.perf_counter() - t0)
    return out


class Cpu:
    """CPU microseconds per call, by process: the load (this process), the service's tree, the MCP server."""

    def __init__(self, load: Any, service: Any):
        self.load, self.service = load, service
        self.mcp: Any = None
        self._at: dict[str, float] = {}

    def _now(self) -> dict[str, float]:
        now = {"load": sum(self.load.cpu_times()[:2]), "service": self.service.cpu_seconds()}
        if self.mcp is not None:
            now["mcp_server"] = sum(self.mcp.cpu_times()[:2])
        return now

    def start(self, mcp: Any = None) -> None:
        self.mcp = mcp
        self._at = self._now()

    def per_call(self, calls: int) -> dict[str, int]:
        return {k: round((v - self._at[k]) / max(1, calls) * 1e6) for k, v in self._now().items()}


async def rate(workers: list[Callable[[int], Awaitable[Any]]], warmup: float,
               duration: float) -> tuple[float, int]:
    """(calls per second of the workers together, each calling back to back, counted in the measured window;
    every call made, warm-up included: what the CPU figures divide by)."""
    counted = made = 0
    stop = time.perf_counter() + warmup + duration
    start = time.perf_counter() + warmup

    async def work(call: Callable[[int], Awaitable[Any]]) -> None:
        nonlocal counted, made
        i = 0
        while (now := time.perf_counter()) < stop:
            await call(i)
            i += 1
            made += 1
            if now >= start:
                counted += 1
    await asyncio.gather(*(work(w) for w in workers))
    return counted / duration, made


async def measure(servers: Servers, reads: int, warmup: float, duration: float, idle: int) -> dict[str, Any]:
    from mcp import ClientSession
    from mcp.client.stdio import StdioServerParameters, stdio_client

    out: dict[str, Any] = {}
    async with service(servers) as (environment, token, child):
        me = psutil.Process()
        cpu = Cpu(me, child)
        client = await sdk(environment, token)
        target = await client.create(SCOPE_ID, "claim", {"statement": "read me"}, ACTOR,
                                     {"provenance_id": "prov:bench", "actor": ACTOR, "activity": "bench"})
        object_id = target["object_id"]
        log(f"serial reads: SDK, then MCP over stdio ({reads} each)")
        out["sdk_read"] = await timed(reads, lambda: client.read(SCOPE_ID, object_id))
        params = StdioServerParameters(command=sys.executable, args=["-m", "pamledger", "mcp"],
                                       env={**os.environ, **environment, "PAMLEDGER_TOKEN": token})
        with open(servers.work_dir / "mcp-stdio.log", "a") as err:
            async with stdio_client(params, errlog=err) as (read, write), ClientSession(read, write) as session:
                await session.initialize()
                out["mcp_read"] = await timed(reads, lambda: session.call_tool(
                    "pamspec.read", {"scope_id": SCOPE_ID, "object_id": object_id}))
        log(f"creates, {CLIENTS} at once: SDK clients, then MCP HTTP sessions ({duration:g} s each)")
        clients = [await sdk(environment, token) for _ in range(CLIENTS)]
        cpu.start()
        out["sdk_create_rate"], calls = await rate([_sdk_creator(c) for c in clients], warmup, duration)
        out["sdk_create_cpu_us"] = cpu.per_call(calls)
        for c in clients:
            await c.close()
        out.update(await http_side(servers, environment, token, warmup, duration, idle, cpu))
        await client.close()
    return out


def _sdk_creator(client: Any) -> Callable[[int], Awaitable[Any]]:
    tag = uuid.uuid4().hex
    return lambda i: client.create(**{**body(i, tag), "actor": ACTOR, "provenance": {
        "provenance_id": "prov:bench", "actor": ACTOR, "activity": "bench"}})


def _mcp_creator(session: Any) -> Callable[[int], Awaitable[Any]]:
    tag = uuid.uuid4().hex
    return lambda i: _ok(session.call_tool("pamspec.create", body(i, tag)))


async def http_side(servers: Servers, environment: dict[str, str], token: str, warmup: float, duration: float,
                    idle: int, cpu: Cpu) -> dict[str, Any]:
    """8 HTTP sessions creating back to back, then the server's memory per idle session."""
    server = HttpProcess({**os.environ, **environment}, servers.work_dir / "mcp-http.log")
    try:
        out: dict[str, Any] = {}
        async with contextlib.AsyncExitStack() as stack:
            sessions = [await stack.enter_async_context(http_session(server.url, token)) for _ in range(CLIENTS)]
            process = psutil.Process(server.proc.pid)
            cpu.start(process)
            out["mcp_create_rate"], calls = await rate([_mcp_creator(s) for s in sessions], warmup, duration)
            out["mcp_create_cpu_us"] = cpu.per_call(calls)
        await asyncio.sleep(1.0)
        before = process.memory_info().rss
        log(f"{idle} idle HTTP sessions")
        async with contextlib.AsyncExitStack() as stack:
            for _ in range(idle):
                await stack.enter_async_context(http_session(server.url, token))
            await asyncio.sleep(1.0)
            after = process.memory_info().rss
        out.update(idle_sessions=idle, rss_before_idle_sessions=before, rss_per_idle_session=(after - before) / idle)
        return out
    finally:
        server.stop()


async def _ok(call: Awaitable[Any]) -> Any:
    result = await call
    if getattr(result, "is_error", False):
        raise RuntimeError(f"an MCP call failed: {result.content[0].text[:500]}")
    return result


def report(out: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    sdk_p50, mcp_p50 = statistics.median(out["sdk_read"]), statistics.median(out["mcp_read"])
    ratios = {"read_p50_ratio": mcp_p50 / sdk_p50, "create_rate_ratio": out["mcp_create_rate"] / out["sdk_create_rate"]}
    lines = [
        f"read p50, serial: SDK {sdk_p50 * 1e3:.3f} ms, MCP stdio {mcp_p50 * 1e3:.3f} ms;"
        f" ratio {ratios['read_p50_ratio']:.2f} (target <= {TARGETS['read_p50_ratio']})",
        f"creates/s, {CLIENTS} at once: SDK {out['sdk_create_rate']:.0f}, MCP HTTP {out['mcp_create_rate']:.0f};"
        f" ratio {ratios['create_rate_ratio']:.2f} (target >= {TARGETS['create_rate_ratio']})",
        f"CPU per create, us by process: SDK {out['sdk_create_cpu_us']}; MCP {out['mcp_create_cpu_us']}",
        f"memory per idle HTTP session: {out['rss_per_idle_session'] / 1024:.0f} KiB"
        f" ({out['idle_sessions']} sessions; server RSS {out['rss_before_idle_sessions'] / 2**20:.0f} MiB before)",
    ]
    verdict = {"read_p50_ratio": ratios["read_p50_ratio"] <= TARGETS["read_p50_ratio"],
               "create_rate_ratio": ratios["create_rate_ratio"] >= TARGETS["create_rate_ratio"]}
    lines.append("targets: " + ", ".join(f"{k} {'met' if v else 'MISSED'}" for k, v in verdict.items()))
    summary = {"sdk_read_p50_ms": sdk_p50 * 1e3, "mcp_read_p50_ms": mcp_p50 * 1e3,
               "sdk_create_rate": out["sdk_create_rate"], "mcp_create_rate": out["mcp_create_rate"],
               "rss_per_idle_session_bytes": out["rss_per_idle_session"], "ratios": ratios, "met": verdict,
               "sdk_create_cpu_us": out["sdk_create_cpu_us"], "mcp_create_cpu_us": out["mcp_create_cpu_us"]}
    return "\n".join(lines), summary


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench mcp", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="300 reads, 2.5 s windows, 20 idle sessions")
    parser.add_argument("--duration", type=float, default=10.0)
    parser.add_argument("--reads", type=int, default=2000)
    parser.add_argument("--idle-sessions", type=int, default=100)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args(argv)
    reads, duration, idle = (300, 2.5, 20) if args.quick else (args.reads, args.duration, args.idle_sessions)
    configure_logging("console", os.environ.get("PAMLEDGER_BENCH_LOG_LEVEL", "warning"))
    began = time.perf_counter()
    with bench_servers() as servers:
        out = asyncio.run(measure(servers, reads, min(2.0, duration / 5), duration, idle))
    text, summary = report(out)
    print(f"pamledger bench mcp: {os.cpu_count()} cores; {time.perf_counter() - began:.0f} s wall;"
          f" 1-min load average {os.getloadavg()[0]:.1f}\n{text}")
    if args.json is not None:
        args.json.write_text(json.dumps(summary, indent=2) + "\n")
    return 0
