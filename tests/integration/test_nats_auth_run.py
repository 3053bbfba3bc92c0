"""`pamledger run` (one process per role, local servers) with auth enforced: every child logs in as the service
user, the writer's process keeps the NATS users in step with tokens issued and revoked, and after nats-server
is SIGKILLed the supervisor brings it back with the same users and the roles log in again.

`run` is a real subprocess on a state dir of its own, so the kill is a real kill.
"""

from __future__ import annotations

import os
import signal
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from authz.bootstrap import read_token
from local_servers.launch import read_servers_file
from pamledger_client.admin import issue_token, parse_grant, put_actor, revoke_token
from pamledger_client.client import MemoryClient
from pamledger_client.errors import PamspecError
from tests.conftest import TEST_SPACE, answers, pamledger_run, wait_for

PLANNER = {"actor_id": "actor:agent:planner", "actor_kind": "agent"}
SCOPE = "workspace:locked"


@pytest.fixture
def run(tmp_path: Path) -> Iterator[tuple[subprocess.Popen[bytes], Path]]:
    with pamledger_run(tmp_path, PAMLEDGER_AUTH__MODE="enforce", PAMLEDGER_INDEXER__DEFAULT_SPACE=TEST_SPACE) as (
            proc, state, _):
        yield proc, state


async def _client(url: str, token: str | None) -> MemoryClient | None:
    try:
        client = await MemoryClient.connect(url, "pamledger", timeout=5.0, token=token)
    except PamspecError:
        return None
    client.retries = 0
    return client


async def _writes(url: str, token: str, label: str) -> bool:
    client = await _client(url, token)
    if client is None:
        return False
    try:
        await client.create(SCOPE, "claim", {"label": label}, PLANNER,
                            {"provenance_id": f"prov:{uuid.uuid4()}", "actor": PLANNER, "activity": "test"})
        return True
    except PamspecError:
        return False
    finally:
        await client.close()


async def _admin_ready(url: str, admin_token: str) -> Any:
    client = await _client(url, admin_token)
    if client is None:
        return None
    try:
        if not await answers(client):  # every role is its own process: each logs in on its own
            await client.close()
            return None
        await client.create_scope(SCOPE)
        return client
    except PamspecError:
        await client.close()
        return None


async def test_run_keeps_nats_users_in_step_and_survives_a_nats_kill(run: tuple[subprocess.Popen[bytes], Path]) -> None:
    proc, state = run
    first = await wait_for(lambda: read_servers_file(state), timeout=180)
    url = first["nats_url"]
    admin_token = read_token(state / "admin.token")
    assert admin_token is not None
    admin = await wait_for(lambda: _admin_ready(url, admin_token), timeout=180, interval=0.5)
    try:
        await put_actor(admin, PLANNER["actor_id"], "agent", [parse_grant("workspace:*=create,read,query")])
        issued = await issue_token(admin, PLANNER["actor_id"])
        await wait_for(lambda: _writes(url, issued["token"], "issued"), timeout=30, interval=0.3)

        os.kill(first["nats_pid"], signal.SIGKILL)
        await wait_for(lambda: (read_servers_file(state) or first)["nats_pid"] != first["nats_pid"], timeout=60)
        await wait_for(lambda: _writes(url, issued["token"], "after the kill"), timeout=120, interval=0.5)

        await revoke_token(admin, issued["token_id"])
        async def locked_out() -> bool:
            client = await _client(url, issued["token"])
            if client is None:
                return True
            await client.close()
            return False
        await wait_for(locked_out, timeout=15, interval=0.3)
    finally:
        await admin.close()
    assert proc.poll() is None
