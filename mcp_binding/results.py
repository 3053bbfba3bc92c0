"""What a tool call answers: `structuredContent` (the SDK's JSON, byte for byte what the NATS binding returns)
and a text block (a one-line summary, then the same JSON), or the PAMSPEC error envelope with `isError`.

Why the JSON in the text too: many hosts hand the model only the text blocks (MCP asks servers that return
structured content to serialize it into a text block as well). Pure.
"""

from __future__ import annotations

import json
from typing import Any

import mcp_types as types

from pamledger_client.errors import PamspecError

KEY_META = "pamledger/idempotency_key"  # `_meta` of a write's result: the idempotency key it was sent with
_IDS = ("object_id", "relationship_id", "version_id", "ledger_sequence", "subscription_id", "start_sequence",
        "delegation_id", "last_delivered_sequence", "last_sequence", "as_of_sequence")
_LISTS = ("items", "versions", "events", "relationships", "objects")


def summary(tool: str, result: dict[str, Any], key: str | None = None) -> str:
    """`tool: ok, object_id=…, version_id=…, 3 items` — what a person or a model reads first."""
    parts = [f"{name}={result[name]}" for name in _IDS if isinstance(result.get(name), (str, int))]
    parts += [f"{len(result[name])} {name}" for name in _LISTS if isinstance(result.get(name), list)]
    if result.get("next_cursor"):
        parts.append("more: pass next_cursor as cursor")
    if key is not None:
        parts.append(f"idempotency_key={key}")
    return f"{tool}: ok" + (", " + ", ".join(parts) if parts else "")


def success(tool: str, result: dict[str, Any], key: str | None = None) -> types.CallToolResult:
    text = summary(tool, result, key) + "\n" + json.dumps(result, sort_keys=True, separators=(",", ":"))
    return types.CallToolResult(content=[types.TextContent(type="text", text=text)], structured_content=result,
                                _meta={KEY_META: key} if key is not None else None)


def failure(tool: str, error: PamspecError) -> types.CallToolResult:
    """The error envelope as a tool result (never an MCP protocol error), so the model sees it and can act."""
    envelope = error.envelope()
    text = f"{tool}: {error.code}: {error.message}\n" + json.dumps({"error": envelope}, sort_keys=True)
    return types.CallToolResult(content=[types.TextContent(type="text", text=text)],
                                structured_content={"error": envelope}, is_error=True)
