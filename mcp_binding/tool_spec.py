"""What a tool is to the MCP binding: its name, description and input schema, and which of its properties the
server fills in when the caller leaves them out. Pure data."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

# Properties the server fills in for the caller when absent (mcp_binding.arguments): who acts is the token's
# actor, provenance names the tool call, a subscription's filter is everything, a relationship is directed.
DEFAULTED = frozenset({"actor", "provenance", "filter", "directionality", "granting_actor"})


@dataclass(frozen=True)
class ToolSpec:
    name: str
    description: str
    properties: dict[str, Any]
    required: tuple[str, ...]  # as published; the advertised schema leaves DEFAULTED out

    def input_schema(self) -> dict[str, Any]:
        """The schema a host sees (tools/list): the published properties, required less what the server fills."""
        required = [name for name in self.required if name not in DEFAULTED]
        return {"type": "object", "required": required, "properties": self.properties}

    def checking_schema(self) -> dict[str, Any]:
        """The schema arguments are checked against: the advertised one, and no property it does not list."""
        return {**self.input_schema(), "additionalProperties": False}


def tool(name: str, description: str, required: list[str], properties: dict[str, Any]) -> ToolSpec:
    return ToolSpec(name, description, properties, tuple(required))
