"""The MCP binding's tools are PAMSPEC's: the twelve of bindings/mcp/tools.json with exactly those names,
descriptions and input properties (only the server-filled fields leave `required`), plus pamledger's own."""

from __future__ import annotations

import json
from typing import Any

import pytest

from mcp_binding.catalog import ALL_TOOLS, CORE_TOOLS, Catalog
from mcp_binding.tool_spec import DEFAULTED
from pamledger_client.errors import PamspecError
from tests.conftest import pamspec_dir


def published() -> dict[str, Any]:
    tools = json.loads((pamspec_dir() / "bindings" / "mcp" / "tools.json").read_text())["tools"]
    return {tool["name"]: tool for tool in tools}


def test_the_twelve_pamspec_tools_are_registered_as_published() -> None:
    ours = {spec.name: spec for spec in ALL_TOOLS if spec.name.startswith("pamspec.")}
    theirs = published()
    assert set(ours) == set(theirs) and len(ours) == 12
    for name, tool in theirs.items():
        spec = ours[name]
        assert spec.description == tool["description"], name
        assert spec.input_schema()["properties"] == tool["inputSchema"]["properties"], name
        assert spec.required == tuple(tool["inputSchema"]["required"]), name
        advertised = spec.input_schema()["required"]
        assert advertised == [f for f in tool["inputSchema"]["required"] if f not in DEFAULTED], name


def test_a_model_can_create_with_scope_type_and_content_alone() -> None:
    assert Catalog().spec("pamspec.create").input_schema()["required"] == ["scope_id", "object_type",
                                                                          "canonical_content"]


def test_pamledgers_own_tools_carry_the_prefix_and_core_is_six() -> None:
    own = [spec.name for spec in ALL_TOOLS if not spec.name.startswith("pamspec.")]
    assert own and all(name.startswith("pamledger.") for name in own)
    assert {"pamledger.search", "pamledger.related", "pamledger.poll", "pamledger.create_scope",
            "pamledger.grant_delegation", "pamledger.check_delegation", "pamledger.revoke_delegation",
            "pamledger.snapshot_create", "pamledger.snapshot_diff", "pamledger.eval_start",
            "pamledger.eval_end"} == set(own)
    assert set(Catalog("core").tools) == CORE_TOOLS and len(CORE_TOOLS) == 6


@pytest.mark.parametrize("tool, arguments, field, words", [
    ("pamspec.create", {"scope_id": "s:a", "object_type": "claim", "canonical_content": 1, "x_host": 1}, "x_host",
     "unknown argument"),
    ("pamspec.create", {"object_type": "claim", "canonical_content": 1}, "scope_id", "missing required"),
    ("pamspec.read", {"scope_id": ["s:a"], "object_id": "mem:x"}, "scope_id", "not of type 'string'"),
    ("pamspec.query", {"scope_id": "s:a", "limit": 0}, "limit", "less than the minimum"),
    ("pamspec.transition", {"scope_id": "s:a", "object_id": "o:x", "expected_version_id": "v:x",
                            "dimension": "colour", "target_state": "x"}, "dimension", "is not one of"),
    ("pamspec.subscribe", {"scope_id": "s:a", "start_sequence": -1}, "start_sequence", "less than the minimum"),
])
def test_arguments_that_do_not_fit_are_invalid_request_naming_the_field(tool: str, arguments: dict[str, Any],
                                                                         field: str, words: str) -> None:
    with pytest.raises(PamspecError) as refused:
        Catalog().check(tool, arguments)
    assert refused.value.code == "invalid_request"
    assert refused.value.details["field"] == field and words in refused.value.message, refused.value.message


def test_an_unknown_tool_is_invalid_request_naming_it_and_listing_the_tools() -> None:
    with pytest.raises(PamspecError) as refused:
        Catalog("core").spec("pamspec.delete")
    assert refused.value.code == "invalid_request" and refused.value.details["tool"] == "pamspec.delete"
    assert refused.value.details["tools"] == sorted(CORE_TOOLS)


def test_arguments_that_are_not_an_object_are_invalid_request() -> None:
    with pytest.raises(PamspecError) as refused:
        Catalog().check("pamspec.read", ["s:a"])
    assert refused.value.code == "invalid_request"
