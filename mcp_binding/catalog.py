"""Every tool the MCP server can register, the `--tools core` subset, and one argument checker per tool.

Arguments are checked against the advertised schema with no property it does not list (hosts add their own:
those are refused by name, never passed on), so a wrong type, a missing argument or an unknown one is
`invalid_request` naming the field before anything reaches the service.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal

import jsonschema

from mcp_binding.own_tools import PAMLEDGER_TOOLS
from mcp_binding.pamspec_tools import PAMSPEC_TOOLS
from mcp_binding.tool_spec import ToolSpec
from pamledger_client.errors import PamspecError

ToolSet = Literal["all", "core"]
TOOL_SETS: tuple[str, ...] = ("all", "core")
# What a host pays context for with `--tools core`: the everyday reads and writes.
CORE_TOOLS = frozenset({"pamspec.read", "pamspec.query", "pamledger.search", "pamspec.create", "pamspec.update",
                        "pamspec.inspect_history"})
ALL_TOOLS: tuple[ToolSpec, ...] = PAMSPEC_TOOLS + PAMLEDGER_TOOLS


def tools_of(tool_set: ToolSet) -> tuple[ToolSpec, ...]:
    return ALL_TOOLS if tool_set == "all" else tuple(t for t in ALL_TOOLS if t.name in CORE_TOOLS)


class Catalog:
    """The registered tools by name, each with its argument checker (built once)."""

    def __init__(self, tool_set: ToolSet = "all"):
        self.tools: Mapping[str, ToolSpec] = {spec.name: spec for spec in tools_of(tool_set)}
        self._checkers = {name: jsonschema.Draft202012Validator(spec.checking_schema())
                          for name, spec in self.tools.items()}

    def spec(self, name: str) -> ToolSpec:
        """The tool named `name`, or invalid_request naming it (and what there is)."""
        spec = self.tools.get(name)
        if spec is None:
            raise PamspecError.of("invalid_request", f"unknown tool {name!r}",
                                  {"field": "name", "tool": name, "tools": sorted(self.tools)})
        return spec

    def check(self, name: str, arguments: Any) -> dict[str, Any]:
        """The arguments when they fit the tool's schema; else invalid_request naming the first bad field."""
        if not isinstance(arguments, dict):
            raise PamspecError.of("invalid_request", "tool arguments must be a JSON object", {"tool": name})
        error = jsonschema.exceptions.best_match(self._checkers[name].iter_errors(arguments))
        if error is not None:
            raise _refusal(name, error)
        return arguments


def _refusal(tool: str, error: jsonschema.ValidationError) -> PamspecError:
    """One invalid_request for one schema failure, in words a model can act on."""
    path = "/".join(str(part) for part in error.absolute_path)
    if error.validator == "additionalProperties":
        unknown = sorted(set(error.instance) - set(error.schema.get("properties", {})))
        field = "/".join(filter(None, [path, unknown[0] if unknown else ""]))
        return PamspecError.of("invalid_request", f"unknown argument {field!r} for {tool}",
                               {"field": field, "tool": tool, "unknown": unknown})
    if error.validator == "required":
        missing = str(error.message).split("'")[1] if "'" in error.message else ""
        field = "/".join(filter(None, [path, missing]))
        return PamspecError.of("invalid_request", f"missing required argument {field!r} for {tool}",
                               {"field": field, "tool": tool})
    return PamspecError.of("invalid_request", f"argument {path or '(arguments)'!r} of {tool}: {error.message[:200]}",
                           {"field": path, "tool": tool, "reason": error.message[:500]})
