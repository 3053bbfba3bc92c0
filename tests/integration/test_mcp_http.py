"""`pamledger mcp --transport http`: many agents on one server, each request as its own bearer token's actor.

Two agents with tokens of their own share one HTTP server: neither reaches the other's scope by tool or
resource, a request without a valid token is refused with 401 before any tool runs, a session cannot be used
with another token, and a token revoked while its session is open stops working within two seconds.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx2 as httpx
import mcp
import psycopg
import pytest

from pamledger_client.admin import parse_grant, put_actor, revoke_token
from tests.conftest import ROLES, Env, Servers, admin_client, enforced_env, serving, wait_for
from tests.integration.mcp_scenario import every_tool
from tests.integration.mcp_support import HttpProcess, agent_token, call, http_server, http_session, refused, resource

pytestmark = pytest.mark.profile("PAMSPEC-Protocol-Binding")  # docs/implementation-report.md

ALICE = {"actor_id": "actor:agent:mcp-alice", "actor_kind": "agent"}
BOB = {"actor_id": "actor:agent:mcp-bob", "actor_kind": "agent"}
SCOPE = {"alice": "workspace:mcp-alice", "bob": "workspace:mcp-bob"}
INITIALIZE = {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
    "protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "raw", "version": "0"}}}
ACCEPT = {"Accept": "application/json, text/event-stream", "Content-Type": "application/json"}


@dataclass
class World:
    env: Env
    admin: Any
    server: HttpProcess
    tokens: dict[str, str]


@pytest.fixture(scope="module")
def env(servers: Servers, tmp_path_factory: pytest.TempPathFactory) -> Env:
    return enforced_env(servers, tmp_path_factory.mktemp("mcp_http_state"), "mcphttp")


@pytest.fixture(scope="module")
def server_log(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("mcp_http_logs") / "server.log"


@pytest.fixture(scope="module")
async def world(env: Env, server_log: Path) -> AsyncIterator[World]:
    async with serving(env, roles=ROLES + ("indexer",)):
        admin = await admin_client(env)
        try:
            tokens = {}
            for name, actor in (("alice", ALICE), ("bob", BOB)):
                tokens[name] = await agent_token(admin, env, actor, [f"{SCOPE[name]}*=*"])
            with http_server(env, server_log) as server:
                yield World(env, admin, server, tokens)
        finally:
            await admin.close()


async def test_every_tool_and_resource_answer_over_http_as_the_tokens_actor(world: World) -> None:
    async with http_session(world.server.url, world.tokens["alice"]) as session:
        await every_tool(session, SCOPE["alice"], ALICE, [{"scopes": [f"{SCOPE['alice']}*"], "operations": ["*"]}])


async def raw_post(url: str, headers: dict[str, str], body: Any = INITIALIZE) -> httpx.Response:
    async with httpx.AsyncClient(timeout=30) as client:
        return await client.post(url, headers={**ACCEPT, **headers}, content=json.dumps(body))


@pytest.mark.parametrize("authorization, rule", [
    (None, "auth.missing_credential"),
    ("Basic dXNlcjpwYXNz", "auth.missing_credential"),
    ("Bearer not-a-token", "auth.malformed_credential"),
    ("Bearer pam_0123456789abcdef_" + "A" * 43, "auth.unknown_credential"),
])
async def test_no_token_or_a_bad_one_is_401_with_the_error_envelope(world: World, authorization: str | None,
                                                                      rule: str) -> None:
    response = await raw_post(world.server.url, {"Authorization": authorization} if authorization else {})
    assert response.status_code == 401
    assert response.headers["www-authenticate"].startswith("Bearer")
    error = response.json()["error"]
    assert error["code"] == "access_denied" and error["policy_rule_id"] == rule, error
    assert set(error) >= {"code", "message", "retryable", "operation_id", "details"}


async def test_two_agents_on_one_server_never_reach_each_others_scope(world: World) -> None:
    async with http_session(world.server.url, world.tokens["alice"]) as alice:
        await call(alice, "pamledger.create_scope", {"scope_id": SCOPE["alice"]})
        secret = await call(alice, "pamspec.create", {"scope_id": SCOPE["alice"], "object_type": "claim",
                                                      "canonical_content": {"statement": "alice-waffle-secret"}})
        async with http_session(world.server.url, world.tokens["bob"]) as bob:
            nowhere = f"workspace:nobody-{uuid.uuid4().hex[:6]}"
            for tool, arguments in (("pamspec.read", {"object_id": secret["object_id"]}),
                                    ("pamspec.inspect_history", {"object_id": secret["object_id"]}),
                                    ("pamspec.inspect_history", {}),
                                    ("pamspec.query", {"filters": {"validation_state": "unverified"}}),
                                    ("pamledger.search", {"text": "waffle", "mode": "lexical"}),
                                    ("pamspec.subscribe", {"start_sequence": 0})):
                theirs = await refused(bob, tool, {"scope_id": SCOPE["alice"], **arguments})
                absent = await refused(bob, tool, {"scope_id": nowhere, **arguments})
                assert theirs["code"] == absent["code"] == "access_denied", (tool, theirs)
                assert theirs["policy_rule_id"] == absent["policy_rule_id"] == "authz.scope_not_granted"
                assert "waffle" not in json.dumps(theirs)
            for uri in (f"pamspec://scope/{SCOPE['alice']}/object/{secret['object_id']}",
                        f"pamspec://scope/{SCOPE['alice']}/events", f"pamspec://scope/{SCOPE['alice']}"):
                with pytest.raises(mcp.MCPError) as denied:
                    await bob.read_resource(uri)
                assert denied.value.error.data["error"]["code"] == "access_denied"
                assert "waffle" not in json.dumps(denied.value.error.data)
            manifest = await resource(bob, "pamspec://manifest")
            assert manifest["caller"]["actor_id"] == BOB["actor_id"] and manifest["scopes"] == [f"{SCOPE['bob']}*"]


async def test_a_session_answers_only_the_token_that_opened_it(world: World) -> None:
    opened = await raw_post(world.server.url, {"Authorization": f"Bearer {world.tokens['alice']}"})
    assert opened.status_code == 200, opened.text
    session_id = opened.headers["mcp-session-id"]
    hijack = await raw_post(world.server.url, {"Authorization": f"Bearer {world.tokens['bob']}",
                                               "mcp-session-id": session_id},
                            {"jsonrpc": "2.0", "id": 2, "method": "tools/list"})
    assert hijack.status_code == 404 and hijack.json()["error"]["code"] == "invalid_request"


async def test_the_manifest_follows_the_grants(world: World) -> None:
    async with http_session(world.server.url, world.tokens["bob"]) as bob:
        extra = f"workspace:mcp-bob-extra-{uuid.uuid4().hex[:6]}"
        await put_actor(world.admin, BOB["actor_id"], "agent",
                        [parse_grant(f"{SCOPE['bob']}*=*"), parse_grant(f"{extra}=read,query")])

        async def shows_it() -> bool:
            return extra in (await resource(bob, "pamspec://manifest"))["scopes"]
        await wait_for(shows_it, timeout=10)
        manifest = await resource(bob, "pamspec://manifest")
        assert manifest["grants"] == [{"scopes": [f"{SCOPE['bob']}*"], "operations": ["*"]},
                                      {"scopes": [extra], "operations": ["read", "query"]}]
        assert manifest["operations"] == ["*", "query", "read"]


async def test_a_token_revoked_inside_an_open_session_is_refused_within_two_seconds(world: World) -> None:
    actor = {"actor_id": f"actor:agent:mcp-short-{uuid.uuid4().hex[:6]}", "actor_kind": "agent"}
    scope = f"workspace:mcp-short-{uuid.uuid4().hex[:6]}"
    token = await agent_token(world.admin, world.env, actor, [f"{scope}=*"])
    token_id = token[4:20]
    async with http_session(world.server.url, token) as session:
        await call(session, "pamledger.create_scope", {"scope_id": scope})
        await revoke_token(world.admin, token_id)
        revoked_at = time.monotonic()
        while True:
            try:
                result = await session.call_tool("pamspec.query", {"scope_id": scope})
                refused_now = result.is_error and result.structured_content["error"]["code"] == "access_denied"
            except mcp.MCPError:
                refused_now = True  # the gate's 401 ends the call before any tool runs
            if refused_now:
                break
            assert time.monotonic() - revoked_at < 2.0, "a revoked token still works"
            await asyncio.sleep(0.05)
    response = await raw_post(world.server.url, {"Authorization": f"Bearer {token}"})
    assert response.status_code == 401


async def test_a_client_that_floods_or_vanishes_mid_call_harms_no_other_session(world: World) -> None:
    import anyio

    async with http_session(world.server.url, world.tokens["alice"]) as alice:
        await call(alice, "pamledger.create_scope", {"scope_id": SCOPE["alice"]})
        opened = await call(alice, "pamspec.subscribe", {"scope_id": SCOPE["alice"]})
    async with http_session(world.server.url, world.tokens["alice"]) as vanishing:  # gone in the middle of a poll
        with anyio.move_on_after(0.5):
            await vanishing.call_tool("pamledger.poll", {"subscription_id": opened["subscription_id"], "wait_ms": 5000})
    async with http_session(world.server.url, world.tokens["alice"]) as flooder, \
            http_session(world.server.url, world.tokens["bob"]) as bob:
        await call(bob, "pamledger.create_scope", {"scope_id": SCOPE["bob"]})
        flood = asyncio.gather(*(flooder.call_tool("pamspec.query", {"scope_id": SCOPE["alice"]}) for _ in range(150)),
                               return_exceptions=True)
        answered = await call(bob, "pamspec.query", {"scope_id": SCOPE["bob"]})
        assert "items" in answered
        outcomes = await flood
        assert all(not isinstance(o, BaseException) and not o.is_error for o in outcomes), \
            [o for o in outcomes if isinstance(o, BaseException) or o.is_error][:3]
    assert world.server.proc.poll() is None  # still serving


@pytest.mark.filterwarnings("ignore::mcp.MCPDeprecationWarning")  # the 2025-11-25 wire's resources/subscribe
async def test_the_events_doorbell_rings_over_http_too(world: World) -> None:
    import mcp_types

    rung: list[str] = []

    async def on_message(message: Any) -> None:
        if isinstance(message, mcp_types.ResourceUpdatedNotification):
            rung.append(message.params.uri)

    async with http_session(world.server.url, world.tokens["bob"], message_handler=on_message) as bob:
        await call(bob, "pamledger.create_scope", {"scope_id": SCOPE["bob"]})
        uri = f"pamspec://scope/{SCOPE['bob']}/events"
        await bob.subscribe_resource(uri)
        await call(bob, "pamspec.create", {"scope_id": SCOPE["bob"], "object_type": "claim",
                                           "canonical_content": {"statement": "ring over http"}})
        await wait_for(lambda: uri in rung, timeout=15)
        with pytest.raises(mcp.MCPError):  # another agent's scope rings nothing: refused
            await bob.subscribe_resource(f"pamspec://scope/{SCOPE['alice']}/events")


async def open_subscriptions(env: Env, scope: str) -> int:
    """Subscriptions of `scope` the gateway holds open (its own table)."""
    async with await psycopg.AsyncConnection.connect(env.database_url) as conn:
        cur = await conn.execute("SELECT count(*) FROM subscriptions WHERE scope_id = %s AND status = 'open'",
                                 (scope,))
        return int((await cur.fetchone())[0])  # type: ignore[index]


@pytest.mark.filterwarnings("ignore::mcp.MCPDeprecationWarning")
async def test_a_doorbell_ends_with_its_unsubscribe_and_with_its_session(world: World) -> None:
    scope = f"{SCOPE['bob']}-bells"
    async with http_session(world.server.url, world.tokens["bob"]) as bob:
        await call(bob, "pamledger.create_scope", {"scope_id": scope})
        uri = f"pamspec://scope/{scope}/events"
        await bob.subscribe_resource(uri)
        await wait_for(lambda: open_subscriptions(world.env, scope), timeout=10)
        await bob.unsubscribe_resource(uri)  # a request of its own, on the same session
        await wait_for(lambda: _none_open(world.env, scope), timeout=10)
        await bob.subscribe_resource(uri)
        await wait_for(lambda: open_subscriptions(world.env, scope), timeout=10)
    await wait_for(lambda: _none_open(world.env, scope), timeout=10)  # the session ended (DELETE): so did it


async def _none_open(env: Env, scope: str) -> bool:
    return await open_subscriptions(env, scope) == 0


@pytest.mark.parametrize("header", ["Authorization", "mcp-session-id"])
async def test_a_repeated_gated_header_is_refused_before_the_sdk_reads_the_first(world: World, header: str) -> None:
    opened = await raw_post(world.server.url, {"Authorization": f"Bearer {world.tokens['alice']}"})
    session_id = opened.headers["mcp-session-id"]
    values = {"Authorization": [f"Bearer {world.tokens['alice']}", f"Bearer {world.tokens['bob']}"],
              "mcp-session-id": [session_id, "another"]}[header]
    base = [("Authorization", f"Bearer {world.tokens['bob']}")] if header != "Authorization" else []
    async with httpx.AsyncClient(timeout=30) as client:
        response = await client.post(world.server.url, content=json.dumps(INITIALIZE), headers=[
            *ACCEPT.items(), *base, *((header, v) for v in values)])
    assert response.status_code == 400
    assert response.json()["error"]["details"]["field"] == f"headers/{header.lower()}"


async def test_another_agents_subscription_cannot_be_polled_or_closed(world: World) -> None:
    async with http_session(world.server.url, world.tokens["alice"]) as alice, \
            http_session(world.server.url, world.tokens["bob"]) as bob:
        await call(alice, "pamledger.create_scope", {"scope_id": SCOPE["alice"]})
        theirs = (await call(alice, "pamspec.subscribe", {"scope_id": SCOPE["alice"], "start_sequence": 0}))
        for tool, arguments in (("pamledger.poll", {"subscription_id": theirs["subscription_id"]}),
                                ("pamspec.unsubscribe", {"scope_id": SCOPE["bob"],
                                                         "subscription_id": theirs["subscription_id"]})):
            error = await refused(bob, tool, arguments)
            assert (error["code"], error["policy_rule_id"]) == ("access_denied", "subscription.not_owner"), error
        assert not (await call(alice, "pamledger.poll", {"subscription_id": theirs["subscription_id"],
                                                         "wait_ms": 0}))["closed"]  # still Alice's, still open


async def test_concurrent_first_requests_of_one_token_share_one_connection(world: World) -> None:
    from mcp_binding.callers import CallerPool, Endpoint

    pool = CallerPool(Endpoint(world.env.nats_url, world.env.settings.subject_prefix))
    try:
        callers = await asyncio.gather(*(pool.authenticate(world.tokens["bob"]) for _ in range(8)))
        assert len({id(c) for c in callers}) == 1 and len(pool) == 1
    finally:
        await pool.close()
