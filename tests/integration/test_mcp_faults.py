"""The MCP server stays up while NATS is away: each call answers service_unavailable (retryable) as a tool
result, and the first call after NATS is back goes through, without restarting anything."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import Env, Servers, fresh_database, fresh_settings, serving, wait_for
from tests.integration.mcp_support import call, stdio_session
from tests.integration.test_faults import nats_private  # noqa: F401 - a NATS of this module's own

SCOPE = "workspace:mcp-faults"


@pytest.fixture(scope="module")
def env(servers: Servers, nats_private: Any) -> Env:
    return Env(Servers(nats_private.url, servers.admin_url), fresh_database(servers, "mcpfaults"), fresh_settings("mcpfaults"))


@pytest.fixture(scope="module")
async def service(env: Env) -> AsyncIterator[Env]:
    async with serving(env):
        yield env


async def test_nats_away_is_service_unavailable_per_call_and_the_server_recovers_by_itself(
        service: Env, nats_private: Any, tmp_path: Path) -> None:
    nats = nats_private
    async with stdio_session(service, None, errlog=tmp_path / "mcp.log",
                             PAMLEDGER_REQUEST_TIMEOUT_SECONDS="1") as session:
        await call(session, "pamledger.create_scope", {"scope_id": SCOPE})
        nats.stop()
        try:
            for _ in range(2):  # the server answers every call while NATS is away, and stays up
                result = await session.call_tool("pamspec.query", {"scope_id": SCOPE})
                assert result.is_error, result
                error = result.structured_content["error"]
                assert error["code"] == "service_unavailable" and error["retryable"] is True, error
        finally:
            nats.restart()

        async def answers() -> bool:
            result = await session.call_tool("pamspec.create", {"scope_id": SCOPE, "object_type": "claim",
                                                                "canonical_content": {"statement": "back"}})
            return not result.is_error
        await wait_for(answers, timeout=60, interval=0.5)
        # With auth off the service proves no one: the binding names its anonymous actor.
        found = await call(session, "pamspec.query", {"scope_id": SCOPE, "filters": {"validation_state": "unverified"}})
        assert found["items"][0]["envelope"]["actor"]["actor_id"] == "actor:mcp:anonymous"


async def test_no_nats_at_all_still_answers_each_call_with_an_envelope(service: Env, tmp_path: Path) -> None:
    async with stdio_session(service, None, errlog=tmp_path / "mcp.log",
                             PAMLEDGER_NATS_URL="nats://127.0.0.1:9") as session:  # nothing listens there
        result = await session.call_tool("pamspec.read", {"scope_id": SCOPE, "object_id": "mem:x"})
        assert result.is_error and result.structured_content["error"]["code"] == "service_unavailable"
        assert "127.0.0.1:9" in result.structured_content["error"]["message"]
