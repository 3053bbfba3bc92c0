"""Closing an SDK client whose NATS connection is reconnecting (the server went away, or cut a revoked
token's login) returns instead of raising: drain is impossible then, so the connection is closed."""

from __future__ import annotations

from pathlib import Path

from local_servers.launch import start_nats
from pamledger_client.client import MemoryClient
from tests.conftest import wait_for


async def test_a_client_closes_while_its_connection_is_reconnecting(tmp_path: Path) -> None:
    server = start_nats(tmp_path / "nats")
    try:
        client = await MemoryClient.connect(server.url, "pam_close", token=None)
    finally:
        server.stop()
    await wait_for(lambda: client.nc.is_reconnecting or client.nc.is_closed, timeout=30)
    await client.close()
    assert client.nc.is_closed
