"""The SDK finds the local service by itself (importing no server code), fails fast on a dead port, and
refuses over-size messages (payload and headers) as PamspecError(invalid_request) on every call path instead
of leaking nats.errors.MaxPayloadError or having nats-server close the connection."""

from __future__ import annotations

import asyncio
import json
import os
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import msgspec
import pytest

from local_servers.launch import free_port
from pamledger_client.client import MemoryClient, PamspecError, SyncMemoryClient
from tests.conftest import ACTOR, PROVENANCE, Env

SCOPE = "workspace:sdk-connect"
FIVE_MB = "x" * 5_000_000


def assert_too_large(error: PamspecError, limit: int) -> None:
    assert error.code == "invalid_request" and not error.retryable
    assert error.details["limit_bytes"] == limit
    assert error.details["size_bytes"] > 5_000_000


async def test_every_async_call_path_refuses_a_5_mb_payload_as_invalid_request(client: MemoryClient) -> None:
    await client.create_scope(SCOPE)
    created = await client.create(SCOPE, "claim", {"s": "small"}, ACTOR, PROVENANCE)
    limit = client.nc.max_payload
    calls: list[Any] = [
        client.create(SCOPE, "claim", {"s": FIVE_MB}, ACTOR, PROVENANCE),
        client.update(SCOPE, created["object_id"], created["version_id"], {"s": FIVE_MB}, ACTOR, PROVENANCE),
        client.command("create", {"scope_id": SCOPE, "object_type": "claim", "canonical_content": FIVE_MB,
                                  "actor": ACTOR, "provenance": PROVENANCE}),
        client.create_scope("workspace:big", description=FIVE_MB),
        client.read(SCOPE, FIVE_MB),
        client.query(SCOPE, text=FIVE_MB),
        client.subscribe(SCOPE, ACTOR, filter={"object_type": FIVE_MB}),
    ]
    for call in calls:
        with pytest.raises(PamspecError) as caught:
            await call
        assert_too_large(caught.value, limit)
    assert (await client.read(SCOPE, created["object_id"]))["canonical_content"] == {"s": "small"}


async def test_the_sync_client_refuses_a_5_mb_payload_as_invalid_request(service: Env,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PAMLEDGER_SUBJECT_PREFIX", service.settings.subject_prefix)

    def write() -> PamspecError:
        client = SyncMemoryClient(service.nats_url)
        try:
            client.create(SCOPE, "claim", {"s": FIVE_MB}, ACTOR, PROVENANCE)
        except PamspecError as exc:
            return exc
        finally:
            client.close()
        raise AssertionError("a 5 MB write was not refused")

    assert_too_large(await asyncio.to_thread(write), 1024 * 1024)


async def test_connect_with_no_url_uses_PAMLEDGER_NATS_URL(service: Env, monkeypatch: pytest.MonkeyPatch,
                                                           tmp_path: Path) -> None:
    monkeypatch.setenv("PAMLEDGER_STATE_DIR", str(tmp_path / "nothing-here"))
    monkeypatch.setenv("PAMLEDGER_NATS_URL", service.nats_url)
    monkeypatch.setenv("PAMLEDGER_SUBJECT_PREFIX", service.settings.subject_prefix)
    async with await MemoryClient.connect() as client:
        assert (await client.status("writer")) is not None


async def test_connect_with_no_url_reads_the_state_dirs_servers_json(service: Env, monkeypatch: pytest.MonkeyPatch,
                                                                     tmp_path: Path) -> None:
    (tmp_path / "servers.json").write_text(json.dumps({"nats_url": service.nats_url}))
    monkeypatch.delenv("PAMLEDGER_NATS_URL", raising=False)
    monkeypatch.setenv("PAMLEDGER_STATE_DIR", str(tmp_path))
    monkeypatch.setenv("PAMLEDGER_SUBJECT_PREFIX", service.settings.subject_prefix)
    async with await MemoryClient.connect() as client:
        assert (await client.status("writer")) is not None


async def test_connect_with_nothing_to_find_says_where_it_looked(monkeypatch: pytest.MonkeyPatch,
                                                                 tmp_path: Path) -> None:
    monkeypatch.delenv("PAMLEDGER_NATS_URL", raising=False)
    monkeypatch.setenv("PAMLEDGER_STATE_DIR", str(tmp_path))
    with pytest.raises(PamspecError) as caught:
        await MemoryClient.connect()
    assert caught.value.code == "service_unavailable"
    assert "PAMLEDGER_NATS_URL" in caught.value.message and str(tmp_path) in caught.value.message


async def test_a_dead_port_fails_fast_with_one_error_naming_the_url(capfd: pytest.CaptureFixture[str]) -> None:
    url = f"nats://127.0.0.1:{free_port()}"
    started = time.monotonic()
    with pytest.raises(PamspecError) as caught:
        await asyncio.wait_for(MemoryClient.connect(url), 10)  # before: retried forever, a traceback each time
    assert time.monotonic() - started < 5
    assert caught.value.code == "service_unavailable" and caught.value.retryable
    assert url in caught.value.message and caught.value.details == {"nats_url": url}
    assert "Traceback" not in capfd.readouterr().err


async def test_the_sync_client_fails_fast_on_a_dead_port_too() -> None:
    url = f"nats://127.0.0.1:{free_port()}"

    def connect() -> PamspecError:
        try:
            SyncMemoryClient(url)
        except PamspecError as exc:
            return exc
        raise AssertionError("connected to a dead port")

    error = await asyncio.wait_for(asyncio.to_thread(connect), 10)
    assert error.code == "service_unavailable" and url in error.message


async def test_headers_count_toward_max_payload_at_the_exact_boundary(service: Env) -> None:
    """A message of exactly max_payload bytes (payload plus headers) reaches the service; one byte more is
    refused by the SDK, and the connection stays up (nats-server would close it, losing requests in flight)."""
    client = await MemoryClient.connect(service.nats_url, service.settings.subject_prefix, timeout=5.0)
    client.retries = 0
    client.token = None  # the headers counted below are exactly these (a `make run` in this checkout leaves a token)
    try:
        await client.create_scope(SCOPE)
        limit = client.nc.max_payload
        caller = client.actor_header(ACTOR)["Pam-Actor"]  # the SDK names the command's actor as the caller
        headers = len(f"NATS/1.0\r\nPam-Operation-Id: op:boundary\r\nPam-Actor: {caller}\r\n\r\n".encode())

        def body(size: int) -> dict[str, Any]:
            empty = {"scope_id": SCOPE, "object_type": "claim", "canonical_content": {"s": ""}, "actor": ACTOR,
                     "provenance": PROVENANCE, "operation_id": "op:boundary", "idempotency_key": "idem:boundary"}
            fill = size - headers - len(msgspec.json.encode(empty))
            return {**empty, "canonical_content": {"s": "x" * fill}}

        with pytest.raises(PamspecError) as at_limit:  # the writer's own, smaller limit answers: it got there
            await client.command("create", body(limit))
        assert at_limit.value.code == "invalid_request"
        assert at_limit.value.details["limit_bytes"] == service.settings.writer.max_payload_bytes
        assert at_limit.value.details["size_bytes"] == limit - headers
        with pytest.raises(PamspecError) as over:
            await client.command("create", body(limit + 1))
        assert over.value.code == "invalid_request" and not over.value.retryable
        assert over.value.details == {"limit_bytes": limit, "size_bytes": limit + 1}
        assert client.nc.is_connected and client.nc.stats["reconnects"] == 0
        assert (await client.status("writer")) is not None
    finally:
        await client.close()


async def test_the_sdk_finds_the_service_without_importing_server_code(service: Env, tmp_path: Path) -> None:
    """Connecting through servers.json loads neither local_servers.launch nor the Postgres or supervisor code."""
    (tmp_path / "servers.json").write_text(json.dumps({"nats_url": service.nats_url}))
    script = textwrap.dedent("""
        import asyncio, json, sys
        from pamledger_client.client import MemoryClient

        async def main():
            async with await MemoryClient.connect() as client:
                await client.status("writer")

        asyncio.run(main())
        server_code = ("local_servers.launch", "local_servers.postgres_server", "local_servers.nats_server", "pamledger.supervisor",
                       "pamledger.runtime", "psycopg")
        print(json.dumps(sorted(name for name in server_code if name in sys.modules)))
    """)
    environment = {k: v for k, v in os.environ.items() if not k.startswith("PAMLEDGER_")}
    environment.update(PAMLEDGER_STATE_DIR=str(tmp_path), PAMLEDGER_SUBJECT_PREFIX=service.settings.subject_prefix)
    proc = await asyncio.create_subprocess_exec(sys.executable, "-c", script, env=environment,
                                                cwd=Path(__file__).parents[2], stdout=asyncio.subprocess.PIPE,
                                                stderr=asyncio.subprocess.PIPE)
    out, err = await asyncio.wait_for(proc.communicate(), 120)
    assert proc.returncode == 0, err.decode()
    assert json.loads(out) == []


async def test_a_refused_login_is_access_denied_every_time(tmp_path: Path) -> None:
    """A NATS with users closes the connection right after its -ERR; now and then the close overtakes the
    -ERR (a connection reset). The SDK asks again instead of calling a refused login unreachable."""
    import json as _json

    from local_servers.nats_server import launch_nats
    from local_servers.launch import free_port
    from pamledger_client.connection import open_nats

    (tmp_path / "nats").mkdir()
    (tmp_path / "nats" / "nats.conf").write_text(  # launch_nats passes it with -c
        _json.dumps({"authorization": {"users": [{"user": "someone", "password": "secret"}]}}))
    server = launch_nats(tmp_path / "nats", free_port())
    try:
        codes = []
        for _ in range(30):
            with pytest.raises(PamspecError) as err:
                await open_nats(server.url, 2.0, token="pam_0123456789abcdef_" + "A" * 43)
            codes.append(err.value.code)
        assert set(codes) == {"access_denied"}, codes
    finally:
        server.stop()
