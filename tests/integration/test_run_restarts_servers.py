"""`pamledger run` brings back the local servers it started: SIGKILL nats-server or the postmaster and the
supervisor restarts it on the same port and data, and the service answers writes again.

`run` is a real subprocess on a state dir of its own, so the kills are real kills.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from authz.bootstrap import read_token
from local_servers.nats_server import nats_info
from local_servers.postgres_server import postgres_answers
from local_servers.launch import clean, read_servers_file
from pamledger_client.client import MemoryClient
from tests.conftest import ACTOR, PROVENANCE, pamledger_run, wait_for

ROOT = Path(__file__).resolve().parents[2]
SCOPE = "workspace:restarts"


@pytest.fixture
def run(tmp_path: Path) -> Iterator[tuple[subprocess.Popen[bytes], Path, Path]]:
    """`pamledger run` on its own state dir; interrupted, then its state dir cleaned, at teardown."""
    with pamledger_run(tmp_path) as running:
        yield running


async def _write(nats_url: str, label: str, state: Path) -> bool:
    """One create through NATS with a fresh connection, as the administrator `run` made in the state dir (auth is
    enforced, as `make run` serves); False while the service does not answer."""
    token = read_token(state / "admin.token")
    if token is None:
        return False
    try:
        client = await MemoryClient.connect(nats_url, "pamledger", timeout=5.0, token=token)
    except Exception:  # noqa: BLE001 - NATS still down
        return False
    client.retries = 0
    try:
        if label == "first":
            await client.create_scope(SCOPE)
        actor = await client.me(ACTOR)
        await client.create(SCOPE, "claim", {"after": label}, actor, {**PROVENANCE, "actor": actor})
        return True
    except Exception:  # noqa: BLE001 - any error means "not back yet"
        return False
    finally:
        await client.close()


def _replaced(state: Path, name: str, old_pid: int) -> dict[str, Any] | None:
    """servers.json once it names a new pid for `name` that answers, else None."""
    recorded = read_servers_file(state)
    if recorded is None or recorded[f"{name}_pid"] == old_pid:
        return None
    answers = nats_info(recorded["nats_port"]) if name == "nats" else postgres_answers(recorded["database_url"])
    return recorded if answers else None


def _events(log_path: Path, event: str) -> list[dict[str, Any]]:
    """The JSON log records of one event name."""
    records = []
    for line in log_path.read_text(errors="replace").splitlines():
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if isinstance(record, dict) and record.get("event") == event:
            records.append(record)
    return records


async def test_run_restarts_killed_servers_in_place(run: tuple[subprocess.Popen[bytes], Path, Path]) -> None:
    proc, state, log_path = run
    first = await wait_for(lambda: read_servers_file(state), timeout=180)
    await wait_for(lambda: _write(first["nats_url"], "first", state), timeout=180)
    for name in ("nats", "postgres"):
        before = read_servers_file(state)
        assert before is not None
        os.kill(before[f"{name}_pid"], signal.SIGKILL)
        after = await wait_for(lambda: _replaced(state, name, before[f"{name}_pid"]), timeout=180)
        assert after[f"{name}_port"] == first[f"{name}_port"]
        assert (after["nats_url"], after["database_url"]) == (first["nats_url"], first["database_url"])
        await wait_for(lambda: _write(first["nats_url"], name, state), timeout=180)
    assert proc.poll() is None
    assert sorted(r["server"] for r in _events(log_path, "supervisor.server_died")) == ["nats", "postgres"]
    assert sorted(r["server"] for r in _events(log_path, "supervisor.server_restarted")) == ["nats", "postgres"]

    proc.send_signal(signal.SIGINT)
    assert proc.wait(timeout=90) == 0
    assert read_servers_file(state) is None
    assert nats_info(first["nats_port"]) is None
    assert not postgres_answers(first["database_url"])


async def test_run_never_brings_back_servers_stopped_by_clean(run: tuple[subprocess.Popen[bytes], Path, Path]) -> None:
    proc, state, log_path = run
    first = await wait_for(lambda: read_servers_file(state), timeout=180)
    await wait_for(lambda: _write(first["nats_url"], "first", state), timeout=180)
    clean(state)  # `pamledger clean` in another terminal while `run` still supervises
    await wait_for(lambda: len(_events(log_path, "supervisor.server_restart_failed")) >= 2, timeout=120)
    assert proc.poll() is None
    assert not (state / "postgres").exists() and read_servers_file(state) is None
    assert nats_info(first["nats_port"]) is None
    assert not postgres_answers(first["database_url"])
