"""The MCP server: the binding's tools and resources on the official SDK's low-level Server, one transport-neutral
set of handlers that ask `callers` who each request acts as (stdio: the one credential; HTTP: the bearer token
of that very request).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import mcp_types as types
from mcp.server import Server, ServerRequestContext
from mcp.shared.exceptions import MCPError

from mcp_binding import resources, results
from mcp_binding.callers import Caller
from mcp_binding.calls import call_tool
from mcp_binding.catalog import Catalog, ToolSet
from mcp_binding.doorbell import Doorbells
from pamledger_client.errors import PamspecError

Resolve = Callable[[ServerRequestContext[Any]], Awaitable[Caller]]
RESOURCE_NOT_FOUND = -32002  # MCP's code for resources/read of a resource that is not there (or not yours)
_NOT_FOUND = frozenset({"object_not_found", "scope_not_found", "access_denied", "object_deleted", "object_redacted"})

INSTRUCTIONS = (
    "pamledger is a versioned, scoped memory service (PAMSPEC). Every call names one scope. Write with "
    "pamspec.create (scope_id, object_type such as claim or working_memory, canonical_content); who acts and "
    "the provenance default to your credential. New objects are `unverified`: pass filters "
    "{\"validation_state\": [\"unverified\", \"corroborated\"]} to pamspec.query or pamledger.search to see "
    "them. Updates need expected_version_id (the version you read). Read pamspec://manifest to see your "
    "scopes and operations.")


def connection_of(ctx: ServerRequestContext[Any]) -> str:
    """Which client connection a request came on: its MCP session id over HTTP, else the one stdio peer."""
    headers = getattr(ctx.request, "headers", None)
    return str(headers.get("mcp-session-id") or "http") if headers is not None else "stdio"


def resource_error(error: PamspecError) -> MCPError:
    """A resource read that failed: an MCP error (resources have no error result) carrying the envelope."""
    code = RESOURCE_NOT_FOUND if error.code in _NOT_FOUND else (-32602 if error.code == "invalid_request" else -32603)
    return MCPError(code, f"{error.code}: {error.message}", {"error": error.envelope()})


@dataclass(frozen=True)
class Binding:
    """The Server, and the doorbells its transport closes on shutdown."""

    server: Server[Any]
    doorbells: Doorbells


def build_server(resolve: Resolve, tool_set: ToolSet, transport: str, version: str) -> Binding:
    """The Server whose handlers run every tool and resource as the caller `resolve` names."""
    catalog = Catalog(tool_set)
    names = list(catalog.tools)
    doorbells = Doorbells()
    listing = [types.Tool(name=spec.name, description=spec.description, input_schema=spec.input_schema())
               for spec in catalog.tools.values()]

    async def _resolved(ctx: ServerRequestContext[Any]) -> Caller:
        try:
            return await resolve(ctx)
        except PamspecError as exc:
            raise resource_error(exc) from None

    async def list_tools(ctx: ServerRequestContext[Any], params: Any) -> types.ListToolsResult:
        return types.ListToolsResult(tools=listing)

    async def on_call_tool(ctx: ServerRequestContext[Any], params: types.CallToolRequestParams) -> types.CallToolResult:
        try:
            caller = await resolve(ctx)
        except PamspecError as exc:
            return results.failure(params.name, exc)
        return await call_tool(catalog, caller, params.name, params.arguments)

    async def list_resources(ctx: ServerRequestContext[Any], params: Any) -> types.ListResourcesResult:
        return types.ListResourcesResult(resources=resources.listed())

    async def list_templates(ctx: ServerRequestContext[Any], params: Any) -> types.ListResourceTemplatesResult:
        return types.ListResourceTemplatesResult(resource_templates=resources.templates())

    async def read_resource(ctx: ServerRequestContext[Any],
                            params: types.ReadResourceRequestParams) -> types.ReadResourceResult:
        caller = await _resolved(ctx)
        try:
            return await resources.read(caller, str(params.uri), transport, names)
        except PamspecError as exc:
            caller.distrust(exc)
            raise resource_error(exc) from None

    async def subscribe(ctx: ServerRequestContext[Any], params: types.SubscribeRequestParams) -> types.EmptyResult:
        caller = await _resolved(ctx)
        try:
            await doorbells.subscribe(connection_of(ctx), ctx.session, caller, str(params.uri))
        except PamspecError as exc:
            caller.distrust(exc)
            raise resource_error(exc) from None
        return types.EmptyResult()

    async def unsubscribe(ctx: ServerRequestContext[Any],
                          params: types.UnsubscribeRequestParams) -> types.EmptyResult:
        await doorbells.unsubscribe(connection_of(ctx), str(params.uri))
        return types.EmptyResult()

    server: Server[Any] = Server("pamledger", version=version, instructions=INSTRUCTIONS,
                                 on_list_tools=list_tools, on_call_tool=on_call_tool,
                                 on_list_resources=list_resources, on_list_resource_templates=list_templates,
                                 on_read_resource=read_resource, on_subscribe_resource=subscribe,
                                 on_unsubscribe_resource=unsubscribe)
    return Binding(server, doorbells)
