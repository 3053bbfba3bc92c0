"""`pamledger mcp`: serve the MCP binding over stdio (the default) or streamable HTTP.

stdio acts with one credential: PAMLEDGER_TOKEN, else the state dir's admin.token (as the CLI does). HTTP
acts, request by request, as the bearer token each request carries; it binds 127.0.0.1 unless told otherwise.
Both talk to the service only through the SDK over NATS, so they run wherever an agent runs.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import importlib.metadata
import json
import sys
from typing import Any

from infra.settings import McpSettings, Settings
from mcp_binding.callers import Caller, CallerPool, Endpoint
from mcp_binding.catalog import TOOL_SETS


def add_mcp_parser(sub: Any) -> None:
    p = sub.add_parser("mcp", help="serve the MCP binding (stdio for one agent, --transport http for many)")
    p.add_argument("--transport", choices=("stdio", "http"), default=None,
                   help="stdio (default; PAMLEDGER_MCP__TRANSPORT) or streamable HTTP at /mcp")
    p.add_argument("--host", default=None, help="HTTP: address to bind (default 127.0.0.1)")
    p.add_argument("--port", type=int, default=None, help="HTTP: port (default 8765; 0 picks a free one)")
    p.add_argument("--tools", choices=TOOL_SETS, default=None,
                   help="all (default) or core: read, query, search, create, update, inspect_history")
    p.add_argument("--allow-host", action="append", default=None, metavar="HOST[:PORT|:*]",
                   help="HTTP: another Host header to accept (DNS-rebinding protection); repeatable")


def options(settings: Settings, args: argparse.Namespace) -> McpSettings:
    """The MCP settings, with the command line over PAMLEDGER_MCP__*."""
    given = {name: getattr(args, flag) for name, flag in (("transport", "transport"), ("host", "host"),
             ("port", "port"), ("tools", "tools"), ("allowed_hosts", "allow_host"))
             if getattr(args, flag, None) is not None}
    return McpSettings.model_validate({**settings.mcp.model_dump(), **given})


def version() -> str:
    try:
        return importlib.metadata.version("pamledger")
    except importlib.metadata.PackageNotFoundError:
        return "0+unknown"


def endpoint_of(settings: Settings) -> Endpoint:
    return Endpoint(settings.nats_url, settings.subject_prefix, settings.request_timeout_seconds,
                    max_in_flight=settings.mcp.max_in_flight)


def run(settings: Settings, args: argparse.Namespace) -> int:
    chosen = options(settings, args)
    if chosen.transport == "stdio":
        asyncio.run(serve_stdio(settings, chosen))
    else:
        asyncio.run(serve_http(settings, chosen))
    return 0


async def serve_stdio(settings: Settings, chosen: McpSettings) -> None:
    from mcp.server.stdio import stdio_server

    from mcp_binding.server import build_server
    from mcp_binding.stdio import pipe_streams

    caller = Caller(endpoint_of(settings), settings.token)  # None: the SDK finds the state dir's token

    async def resolve(ctx: Any) -> Caller:
        return caller

    binding = build_server(resolve, chosen.tools, "stdio", version())
    try:
        async with pipe_streams(chosen.stdio_pipes) as pipes:
            async with stdio_server(*(pipes or (None, None))) as (read, write):
                await binding.server.run(read, write, binding.server.create_initialization_options())
    finally:
        await binding.doorbells.close()
        await caller.close()


async def serve_http(settings: Settings, chosen: McpSettings) -> None:
    import uvicorn

    from mcp_binding.http import BearerGate, resolver, transport_security
    from mcp_binding.server import build_server

    pool = CallerPool(endpoint_of(settings), chosen.verify_seconds, chosen.idle_seconds, chosen.max_callers)
    binding = build_server(resolver(pool), chosen.tools, "streamable-http", version())
    app = binding.server.streamable_http_app(
        host=chosen.host, transport_security=transport_security(chosen.host, chosen.allowed_hosts),
        json_response=chosen.http_json_response)
    config = uvicorn.Config(BearerGate(app, pool, binding.doorbells.end), host=chosen.host, port=chosen.port, log_level="warning",
                            lifespan="on")
    server = uvicorn.Server(config)
    sweeper = asyncio.create_task(pool.sweep_forever())
    announcer = asyncio.create_task(_announce(server, chosen))
    try:
        await server.serve()
    finally:
        for task in (sweeper, announcer):
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        await binding.doorbells.close()
        await pool.close()


async def _announce(server: Any, chosen: McpSettings) -> None:
    """One JSON line on stderr once the port is bound: the URL hosts connect to (port 0: the one picked)."""
    while not server.started:
        await asyncio.sleep(0.02)
    port = server.servers[0].sockets[0].getsockname()[1] if server.servers else chosen.port
    host = f"[{chosen.host}]" if ":" in chosen.host else chosen.host
    print(json.dumps({"mcp": "serving", "transport": "streamable-http", "url": f"http://{host}:{port}/mcp",
                      "tools": chosen.tools}), file=sys.stderr, flush=True)
