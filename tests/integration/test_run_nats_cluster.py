"""`PAMLEDGER_NATS__NODES=3 pamledger run`: a 3-node JetStream cluster on loopback, supervised node by node.

Each node has its own store and the users of the state dir (auth enforced, as `make run` serves); the
ledger stream is R3; a SIGKILLed node is restarted on its port and store, rejoins, and the service writes
on. `run` is a real subprocess on a state dir of its own, so the kill is a real kill.
"""

from __future__ import annotations

import os
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import nats
import pytest

from authz.nats_auth import read_service_login
from infra.nats_servers import server_urls
from local_servers.launch import LocalStack, NodesChanged, clean, read_servers_file, stop_from_file
from local_servers.nats_server import nats_info
from authz.bootstrap import read_token
from pamledger_client.admin import issue_token, parse_grant, put_actor, revoke_token
from pamledger_client.client import MemoryClient
from tests.conftest import pamledger_run, wait_for
from tests.integration.test_nats_auth_run import PLANNER, _client, _writes
from tests.integration.test_nats_auth_run import SCOPE as LOCKED_SCOPE
from tests.integration.test_run_restarts_servers import _events, _write


@pytest.fixture
def run(tmp_path: Path) -> Iterator[tuple[subprocess.Popen[bytes], Path, Path]]:
    with pamledger_run(tmp_path, PAMLEDGER_NATS__NODES="3", PAMLEDGER_INDEXER__DEFAULT_SPACE="hashing-64",
                       PAMLEDGER_METRICS__PORT="0") as running:
        yield running


def _node(state: Path, name: str) -> dict[str, Any]:
    recorded = read_servers_file(state) or {}
    return next(node for node in recorded.get("nats_nodes", []) if node["name"] == name)


def _replaced(state: Path, name: str, old_pid: int) -> dict[str, Any] | None:
    node = _node(state, name)
    return node if node["pid"] != old_pid and nats_info(node["port"]) is not None else None


async def _refuses_anonymous(url: str) -> bool:
    try:
        nc = await nats.connect(url, max_reconnect_attempts=1, allow_reconnect=False, connect_timeout=2)
    except Exception as exc:  # noqa: BLE001 - what a NATS with users answers a client without a login
        return "authorization" in str(exc).lower()
    await nc.close()
    return False


async def _stream_replicas(url: str, state: Path) -> int:
    login = read_service_login(state)
    assert login is not None
    nc = await nats.connect(server_urls(url), **login.options())
    try:
        return int((await nc.jetstream().stream_info("PAMLEDGER")).config.num_replicas or 1)
    finally:
        await nc.close()


async def _issued_tokens_log_in_and_revoked_ones_are_refused_on_every_node(url: str, state: Path,
                                                                          nodes: list[dict[str, Any]]) -> None:
    """A token issued while the cluster runs reaches every node's users (one file, reloaded on each); revoked,
    it is refused on every node."""
    admin_token = read_token(state / "admin.token")
    assert admin_token is not None
    admin = await MemoryClient.connect(url, "pamledger", timeout=5.0, token=admin_token)
    try:
        await admin.create_scope(LOCKED_SCOPE)
        await put_actor(admin, PLANNER["actor_id"], "agent", [parse_grant("workspace:*=create,read,query")])
        issued = await issue_token(admin, PLANNER["actor_id"])
        for node in nodes:
            await wait_for(lambda node=node: _writes(f"nats://127.0.0.1:{node['port']}", issued["token"], "issued"),
                           timeout=30, interval=0.3)
        await revoke_token(admin, issued["token_id"])
        for node in nodes:
            await wait_for(lambda node=node: _locked_out(f"nats://127.0.0.1:{node['port']}", issued["token"]),
                           timeout=15, interval=0.3)
    finally:
        await admin.close()


async def _locked_out(url: str, token: str) -> bool:
    client = await _client(url, token)
    if client is None:
        return True
    await client.close()
    return False


async def test_run_starts_a_three_node_cluster_and_restarts_a_killed_node_in_place(
        run: tuple[subprocess.Popen[bytes], Path, Path]) -> None:
    proc, state, log_path = run
    first = await wait_for(lambda: read_servers_file(state), timeout=180)
    nodes = first["nats_nodes"]
    assert [node["name"] for node in nodes] == ["nats", "nats-2", "nats-3"]
    assert first["nats_url"] == ",".join(f"nats://127.0.0.1:{node['port']}" for node in nodes)
    await wait_for(lambda: _write(first["nats_url"], "first", state), timeout=180)
    for node in nodes:  # the users and permissions of the state dir hold on every node
        assert await _refuses_anonymous(f"nats://127.0.0.1:{node['port']}")
        assert await _write(f"nats://127.0.0.1:{node['port']}", f"via-{node['name']}", state)
    assert await _stream_replicas(first["nats_url"], state) == 3
    await _issued_tokens_log_in_and_revoked_ones_are_refused_on_every_node(first["nats_url"], state, nodes)

    killed = _node(state, "nats-2")
    os.kill(killed["pid"], signal.SIGKILL)
    back = await wait_for(lambda: _replaced(state, "nats-2", killed["pid"]), timeout=120)
    assert (back["port"], back["cluster_port"], back["data_dir"]) == (killed["port"], killed["cluster_port"],
                                                                       killed["data_dir"])
    await wait_for(lambda: _write(f"nats://127.0.0.1:{back['port']}", "after", state), timeout=60)
    assert proc.poll() is None
    assert [r["server"] for r in _events(log_path, "supervisor.server_died")] == ["nats-2"]
    assert [r["server"] for r in _events(log_path, "supervisor.server_restarted")] == ["nats-2"]

    proc.send_signal(signal.SIGINT)
    assert proc.wait(timeout=90) == 0
    assert read_servers_file(state) is None
    assert all(nats_info(node["port"]) is None for node in nodes)


def test_up_reuses_a_running_cluster_refuses_another_node_count_and_down_stops_every_node(tmp_path: Path) -> None:
    state = tmp_path / "state"
    stack = LocalStack.up(state, nats_nodes=3)
    try:
        assert stack.started == {"nats", "nats-2", "nats-3", "postgres"}
        again = LocalStack.up(state, nats_nodes=3)  # `pamledger up` in another terminal
        assert again.started == frozenset() and again.nats_url == stack.nats_url
        with pytest.raises(NodesChanged):
            LocalStack.up(state, nats_nodes=1)
        (state / "servers.json").unlink()  # even unrecorded, the nodes holding the stores are found
        stop_from_file(state)
        assert all(nats_info(node.port) is None for node in stack.nats_nodes)
    finally:
        clean(state)
