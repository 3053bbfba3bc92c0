"""Run one tool call through the SDK as its caller: checked arguments in, the service's result or error out.

Every failure a host can see is a PamspecError (the PAMSPEC envelope): a bad argument before anything is sent,
the service's refusal, or service_unavailable while NATS or the service is away. Anything else is a bug,
answered internal_error and logged, never a crashed server.
"""

from __future__ import annotations

import uuid
from typing import Any

import mcp_types as types
import structlog

from mcp_binding import results
from mcp_binding.arguments import (
    WRITES,
    history_call,
    history_events,
    invalid,
    query_call,
    related_body,
    search_body,
    subscription_open,
    write_body,
)
from mcp_binding.callers import Caller
from mcp_binding.catalog import Catalog
from pamledger_client.errors import PamspecError

log = structlog.get_logger(__name__)


async def call_tool(catalog: Catalog, caller: Caller, name: str, arguments: Any) -> types.CallToolResult:
    """The tool result for one call, error or not."""
    try:
        catalog.spec(name)
        checked = catalog.check(name, arguments if arguments is not None else {})
        async with caller.turns:  # a flooding credential waits for itself, not for everyone
            result, key = await _run(caller, name, checked)
    except PamspecError as exc:
        caller.distrust(exc)
        return results.failure(name, exc)
    except Exception as exc:  # noqa: BLE001 - a bug must answer, not take the session down
        log.exception("mcp.tool_failed", tool=name, error=type(exc).__name__)
        return results.failure(name, PamspecError.of("internal_error", f"the MCP server failed: {type(exc).__name__}"))
    return results.success(name, result, key)


async def _run(caller: Caller, name: str, args: dict[str, Any]) -> tuple[dict[str, Any], str | None]:
    """(result, idempotency key of a write)."""
    if name in WRITES:
        command, body, key = write_body(name, args, await caller.actor())
        client = await caller.client()
        return await client.command(command, body), key
    client = await caller.client()
    if args.get("snapshot_id") is not None and not (name == "pamspec.read" or (
            name == "pamspec.query" and args.get("semantic") is None)):
        raise invalid("reads at an evaluation snapshot are read and structured query; semantic query at a "
                      "snapshot is not built yet", field="snapshot_id")
    match name:
        case "pamspec.read":
            return await client.query_request("read", args), None
        case "pamspec.query":
            return await client.query_request(*query_call(args)), None
        case "pamspec.inspect_history":
            return await _history(client, args), None
        case "pamspec.subscribe":
            body = subscription_open(args, await caller.actor(), f"op:mcp-{uuid.uuid4()}")
            return await client.subscription_request("open", body), None
        case "pamspec.unsubscribe":
            return await client.subscription_request("close", {"subscription_id": args["subscription_id"]}), None
        case "pamledger.poll":
            return await client.subscription_request("poll", args), None
        case "pamledger.search":
            return await client.query_request("search", search_body(args)), None
        case "pamledger.related":
            return await client.query_request("related", related_body(args)), None
        case "pamledger.snapshot_diff":
            return await client.query_request("snapshot_diff", args), None
        case "pamledger.create_scope":
            return await client.command("create_scope", {"scope_kind": "workspace", **args}), None
    raise invalid(f"unknown tool {name!r}", field="name")


async def _history(client: Any, args: dict[str, Any]) -> dict[str, Any]:
    """One object's versions and events, or (no object_id) one page of the scope's ledger events."""
    page: dict[str, Any] = await client.query_request(*history_call(args))
    return page if "object_id" not in args else history_events(page, args.get("after_sequence"),
                                                                args.get("event_classes"))
