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
    history_events,
    invalid,
    query_call,
    search_body,
    subscription_open,
    write_body,
)
from mcp_binding.callers import Caller
from mcp_binding.catalog import Catalog
from memory_client.errors import PamspecError

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
    if args.get("snapshot_id") is not None:
        raise PamspecError.of("snapshot_not_found", "no evaluation snapshot has this id (pamledger has no "
                              "evaluation snapshots yet)", {"snapshot_id": args["snapshot_id"]})
    match name:
        case "pamspec.read":
            return await client.read(args["scope_id"], args["object_id"], args.get("version_id")), None
        case "pamspec.query":
            kind, body = query_call(args)
            if kind == "search":
                return await client.search(**_search_arguments(body)), None
            return await client.query(body.pop("scope_id"), **body), None
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
            return await client.search(**_search_arguments(search_body(args))), None
        case "pamledger.related":
            optional = {k: args[k] for k in ("direction", "hops", "limit") if k in args}
            return await client.related(args["scope_id"], args["object_id"], args.get("relationship_types"),
                                        **optional), None
        case "pamledger.create_scope":
            return await client.create_scope(args["scope_id"], args.get("scope_kind", "workspace"),
                                             **{k: v for k, v in args.items() if k not in ("scope_id", "scope_kind")}), None
    raise invalid(f"unknown tool {name!r}", field="name")


def _search_arguments(body: dict[str, Any]) -> dict[str, Any]:
    """Search's fields as MemoryClient.search's parameters (its filters go in `filter`)."""
    named = {"scope_id": "scope_id", "text": "text", "vector": "vector", "embedding_space_id": "space",
             "mode": "mode", "limit": "limit"}
    out: dict[str, Any] = {ours: body[field] for field, ours in named.items() if field in body}
    body.pop("operation_id", None)  # searches carry no operation id of their own in the SDK
    out["filter"] = {k: v for k, v in body.items() if k not in named}
    return out


async def _history(client: Any, args: dict[str, Any]) -> dict[str, Any]:
    """One object's versions and events, or (no object_id) one page of the scope's ledger events."""
    after, classes = args.get("after_sequence"), args.get("event_classes")
    if args.get("object_id") is None:
        page: dict[str, Any] = await client.events(args["scope_id"], after or 0, 100, classes or None)
        return page
    return history_events(await client.history(args["scope_id"], args["object_id"]), after, classes)
