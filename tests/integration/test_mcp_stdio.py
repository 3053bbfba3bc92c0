"""`pamledger mcp` over stdio, as an MCP host runs it (a subprocess, the official client): every tool and
resource, acting as the actor of the token it was given (PAMLEDGER_TOKEN), never as the administrator.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import mcp
import mcp_types
import pytest
from mcp import ClientSession
from mcp.client.stdio import StdioServerParameters, stdio_client

from tests.conftest import ROLES, ROOT, Env, Servers, admin_client, enforced_env, serving, wait_for
from tests.integration.mcp_scenario import every_tool
from tests.integration.mcp_support import agent_token, call, resource, stdio_session

pytestmark = pytest.mark.profile("PAMSPEC-Protocol-Binding")  # docs/implementation-report.md

AGENT = {"actor_id": "actor:agent:mcp-stdio", "actor_kind": "agent"}
SCOPE = "workspace:mcp-stdio"


@dataclass
class World:
    env: Env
    token: str
    logs: Path


@pytest.fixture(scope="module")
def env(servers: Servers, tmp_path_factory: pytest.TempPathFactory) -> Env:
    return enforced_env(servers, tmp_path_factory.mktemp("mcp_stdio_state"), "mcpstdio")


@pytest.fixture(scope="module")
async def world(env: Env, tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[World]:
    async with serving(env, roles=ROLES + ("indexer",)):
        admin = await admin_client(env)
        try:
            token = await agent_token(admin, env, AGENT, [f"{SCOPE}*=*"])
            yield World(env, token, tmp_path_factory.mktemp("mcp_stdio_logs"))
        finally:
            await admin.close()


async def test_every_tool_and_resource_answer_over_stdio_as_the_tokens_actor(world: World) -> None:
    async with stdio_session(world.env, world.token, errlog=world.logs / "stdio.log") as session:
        await every_tool(session, SCOPE, AGENT, [{"scopes": [f"{SCOPE}*"], "operations": ["*"]}])


async def test_core_tools_are_the_six_everyday_ones(world: World) -> None:
    async with stdio_session(world.env, world.token, "--tools", "core", errlog=world.logs / "core.log") as session:
        names = {t.name for t in (await session.list_tools()).tools}
        assert names == {"pamspec.read", "pamspec.query", "pamledger.search", "pamspec.create", "pamspec.update",
                         "pamspec.inspect_history"}
        refused = await session.call_tool("pamspec.delete", {"scope_id": SCOPE, "object_id": "mem:x",
                                                             "expected_version_id": "ver:x"})
        assert refused.is_error and refused.structured_content["error"]["details"]["tool"] == "pamspec.delete"


async def test_naming_another_actor_is_access_denied(world: World) -> None:
    async with stdio_session(world.env, world.token, errlog=world.logs / "other.log") as session:
        await call(session, "pamledger.create_scope", {"scope_id": f"{SCOPE}-x"})
        result = await session.call_tool("pamspec.create", {
            "scope_id": f"{SCOPE}-x", "object_type": "claim", "canonical_content": {"s": 1},
            "actor": {"actor_id": "actor:pamledger:admin", "actor_kind": "operator"}})
        assert result.is_error and result.structured_content["error"]["code"] == "access_denied"
        assert result.structured_content["error"]["policy_rule_id"] == "authz.actor_mismatch"


async def test_a_caller_supplied_idempotency_key_is_used_verbatim(world: World) -> None:
    async with stdio_session(world.env, world.token, errlog=world.logs / "key.log") as session:
        await call(session, "pamledger.create_scope", {"scope_id": f"{SCOPE}-k"})
        body: dict[str, Any] = {"scope_id": f"{SCOPE}-k", "object_type": "claim", "canonical_content": {"s": 1},
                                "idempotency_key": "agent-key-1"}
        first = await session.call_tool("pamspec.create", body)
        second = await session.call_tool("pamspec.create", {**body, "canonical_content": {"s": 2}})
        assert first.meta["pamledger/idempotency_key"] == "agent-key-1"
        assert second.is_error and second.structured_content["error"]["code"] == "duplicate_operation"


@pytest.mark.filterwarnings("ignore::mcp.MCPDeprecationWarning")  # the 2025-11-25 wire's resources/subscribe
async def test_subscribing_to_the_events_resource_rings_a_doorbell_on_each_new_event(world: World) -> None:
    scope = f"{SCOPE}-bell"
    rung: list[str] = []

    async def on_message(message: Any) -> None:
        if isinstance(message, mcp_types.ResourceUpdatedNotification):
            rung.append(message.params.uri)

    async with stdio_session(world.env, world.token, errlog=world.logs / "bell.log", message_handler=on_message) as s:
        await call(s, "pamledger.create_scope", {"scope_id": scope})
        uri = f"pamspec://scope/{scope}/events"
        await s.subscribe_resource(uri)
        created = await call(s, "pamspec.create", {"scope_id": scope, "object_type": "claim",
                                                   "canonical_content": {"statement": "ding"}})
        await wait_for(lambda: uri in rung, timeout=15)
        page = await resource(s, f"{uri}?after_sequence={created['ledger_sequence'] - 1}")
        assert page["events"][0]["event"]["object_id"] == created["object_id"]
        await s.unsubscribe_resource(uri)
        with pytest.raises(mcp.MCPError):
            await s.subscribe_resource(f"pamspec://scope/{scope}")  # only events resources ring


async def test_a_dropped_session_loses_no_position_of_its_subscription(world: World) -> None:
    scope = f"{SCOPE}-drop"
    async with stdio_session(world.env, world.token, errlog=world.logs / "drop1.log") as first:
        await call(first, "pamledger.create_scope", {"scope_id": scope})
        for i in range(3):
            await call(first, "pamspec.create", {"scope_id": scope, "object_type": "claim",
                                                 "canonical_content": {"n": i}})
        opened = await call(first, "pamspec.subscribe", {"scope_id": scope, "start_sequence": 0,
                                                         "filter": {"event_classes": ["object_created"]}})
        got = await call(first, "pamledger.poll", {"subscription_id": opened["subscription_id"], "max_events": 1})
    async with stdio_session(world.env, world.token, errlog=world.logs / "drop2.log") as second:  # a new process
        rest = await call(second, "pamledger.poll", {"subscription_id": opened["subscription_id"], "wait_ms": 0})
    contents = [e["event"]["object_id"] for e in got["events"] + rest["events"]]
    assert len(contents) == 3 and len(set(contents)) == 3
    assert rest["events"][0]["ledger_sequence"] > got["last_delivered_sequence"]


def readme_host_config() -> dict[str, Any]:
    """The MCP host configuration block of the README (the first ```json block of "Use from an MCP host")."""
    text = (ROOT / "README.md").read_text()
    section = text.split("## Use from an MCP host", 1)[1].split("\n## ", 1)[0]
    return json.loads(re.findall(r"^```json\n(.*?)^```", section, flags=re.M | re.S)[0])


async def test_the_readme_host_config_works_as_pasted(world: World, tmp_path: Path) -> None:
    """What a new user pastes: the command and args as written (this checkout's path in place of the
    placeholder), the env as written (its state dir naming this test's NATS, the agent's token)."""
    entry = readme_host_config()["mcpServers"]["pamledger"]
    command = entry["command"].replace("/ABSOLUTE/PATH/TO/pamledger", str(ROOT))
    assert Path(command).is_file(), command
    state = tmp_path / ".pamledger"
    state.mkdir()
    (state / "servers.json").write_text(json.dumps({"nats_url": world.env.nats_url}))
    assert set(entry["env"]) == {"PAMLEDGER_STATE_DIR", "PAMLEDGER_TOKEN"}
    pasted = {"PAMLEDGER_STATE_DIR": str(state), "PAMLEDGER_TOKEN": world.token,
              "PAMLEDGER_SUBJECT_PREFIX": world.env.settings.subject_prefix}  # this module's own subjects
    base = {k: v for k, v in os.environ.items() if not k.startswith("PAMLEDGER_")}
    params = StdioServerParameters(command=command, args=entry["args"], env={**base, **pasted}, cwd=str(tmp_path))
    with open(world.logs / "readme.log", "a") as err:
        async with stdio_client(params, errlog=err) as (read, write), ClientSession(read, write) as session:
            await session.initialize()
            manifest = await resource(session, "pamspec://manifest")
            assert manifest["caller"]["actor_id"] == AGENT["actor_id"]
