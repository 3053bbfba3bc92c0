"""Driving `pamledger mcp` as a host would: a real subprocess (stdio, or HTTP on a port it picks) and the
official MCP client (`mcp.ClientSession`), against a service running in the test's event loop.
"""

from __future__ import annotations

import contextlib
import json
import sys
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

from mcp import ClientSession
from mcp.client.stdio import StdioServerParameters, stdio_client

from mcp_binding.launch import HttpProcess, http_session
from tests.conftest import ROOT, Env, service_environment

__all__ = ["HttpProcess", "agent_token", "call", "http_server", "http_session", "mcp_environment", "refused",
           "resource", "stdio_session"]


def mcp_environment(env: Env, token: str | None, **extra: str) -> dict[str, str]:
    """The environment of an MCP server for `env`: its NATS and prefix, `token` as PAMLEDGER_TOKEN."""
    environment = service_environment(env, **extra)
    environment.pop("PAMLEDGER_TOKEN", None)
    if token is not None:
        environment["PAMLEDGER_TOKEN"] = token
    return environment


@contextlib.asynccontextmanager
async def stdio_session(env: Env, token: str | None, *args: str, errlog: Any = None, message_handler: Any = None,
                        **extra: str) -> AsyncIterator[ClientSession]:
    """An initialized session with `pamledger mcp` (stdio) as a subprocess of this test; `message_handler`
    receives what the server sends unasked (notifications)."""
    params = StdioServerParameters(command=sys.executable, args=["-m", "pamledger", "mcp", *args],
                                   env=mcp_environment(env, token, **extra), cwd=str(ROOT))
    with open(errlog or "/dev/null", "a") as err:
        async with stdio_client(params, errlog=err) as (read, write):
            async with ClientSession(read, write, message_handler=message_handler) as session:
                await session.initialize()
                yield session


@contextlib.contextmanager
def http_server(env: Env, log: Path, *args: str, **extra: str) -> Iterator[HttpProcess]:
    """`pamledger mcp --transport http` for `env`, on a port it picks (`.url`), stopped at the end."""
    server = HttpProcess(mcp_environment(env, None, **extra), log, *args, cwd=ROOT)
    try:
        yield server
    finally:
        server.stop()


async def call(session: ClientSession, tool: str, arguments: dict[str, Any]) -> dict[str, Any]:
    """The structured result of a call that must succeed (its error envelope in the message otherwise)."""
    result = await session.call_tool(tool, arguments)
    assert not result.is_error, f"{tool} failed: {result.content[0].text[:800] if result.content else result}"
    assert isinstance(result.structured_content, dict)
    return result.structured_content


async def refused(session: ClientSession, tool: str, arguments: dict[str, Any]) -> dict[str, Any]:
    """The error envelope of a call that must fail as a tool result (isError, structuredContent.error)."""
    result = await session.call_tool(tool, arguments)
    assert result.is_error, f"{tool} succeeded: {result.structured_content}"
    error = (result.structured_content or {})["error"]
    assert set(error) >= {"code", "message", "retryable", "operation_id", "details"}, error
    assert result.content and error["code"] in result.content[0].text
    return error  # type: ignore[no-any-return]


async def resource(session: ClientSession, uri: str) -> Any:
    read = await session.read_resource(uri)
    return json.loads(read.contents[0].text)  # type: ignore[union-attr]


async def agent_token(admin: Any, env: Env, actor: dict[str, str], grants: list[str]) -> str:
    """Register `actor` with `grants` (`SCOPES=OPS` texts) and issue it a token that works at once."""
    from pamledger_client.admin import issue_token, parse_grant, put_actor

    await put_actor(admin, actor["actor_id"], actor["actor_kind"], [parse_grant(g) for g in grants])
    return str((await issue_token(admin, actor["actor_id"]))["token"])
