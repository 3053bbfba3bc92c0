"""A long NATS outage logs one line per change of state, not one per retry: its log stops growing.

Why: the relay, projector and gateway logged `*.identity_check_failed` on every retry of the ledger
identity check (every 2 s plus a 5 s request timeout), so the log grew with the outage's length. A real
`pamledger serve` process (every role) with JSON logs against a nats-server of the module's own, SIGKILLed;
two equal windows of the outage are compared: the second may only say what was not said yet.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from pamledger_client.client import MemoryClient
from tests.conftest import service_environment, Env, Servers, fresh_database, fresh_settings, wait_for
from tests.integration.test_faults import leader_pid, nats_private  # noqa: F401 - module-scoped here too

ROOT = Path(__file__).resolve().parents[2]
LOCK_POLL_SECONDS = 0.2  # a role's restart backoff starts here and is capped at 10x it
OUTAGE_WINDOW_SECONDS = 12.0  # a retry of the identity check took 7 s (2 s + a 5 s request timeout)


class Serve:
    """One `pamledger serve --roles ROLES` process, JSON logs to a file."""

    def __init__(self, env: Env, roles: str, log_path: Path):
        environment = service_environment(env, PAMLEDGER_WRITER__LOCK_POLL_SECONDS=str(LOCK_POLL_SECONDS))
        self.path = log_path
        self.log = open(log_path, "ab")
        self.proc = subprocess.Popen([sys.executable, "-m", "pamledger", "serve", "--roles", roles],
                                     cwd=ROOT, env=environment, stdout=self.log, stderr=self.log)

    def text(self) -> str:
        return self.path.read_text(errors="replace")

    def records(self) -> list[dict[str, Any]]:
        return [json.loads(line) for line in self.text().splitlines()]

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()


@pytest.fixture
def serving() -> Iterator[list[Serve]]:
    started: list[Serve] = []
    yield started
    for proc in started:
        proc.stop()


async def test_a_long_nats_outage_adds_almost_no_log_lines(
        servers: Servers, nats_private: Any, tmp_path: Path, serving: list[Serve]) -> None:  # noqa: F811
    env = Env(Servers(nats_private.url, servers.admin_url), fresh_database(servers, "outagelogs"),
              fresh_settings("outagelogs"))
    proc = Serve(env, "all", tmp_path / "serve.log")
    serving.append(proc)
    client = await MemoryClient.connect(env.nats_url, env.settings.subject_prefix, timeout=10.0)
    for role in ("writer", "projector", "gateway"):
        await wait_for(lambda: leader_pid(client, role), timeout=120)
    await client.close()

    nats_private.kill()
    await asyncio.sleep(OUTAGE_WINDOW_SECONDS)  # the outage itself, not a wait for a condition
    first = proc.text()
    await asyncio.sleep(OUTAGE_WINDOW_SECONDS)
    second = proc.text()[len(first):]
    nats_private.restart()

    first_lines = first.count("\n")
    added = second.splitlines()
    assert "Traceback" not in first + second
    # One line per change of state: the second window says nothing the outage already said. (A role may
    # reach a new state late: a follower notices the outage only after its idle check and a resubscribe
    # timed out, ~12 s on a loaded machine; that first line is a change, not a repeat.)
    said = {json.loads(line)["event"] for line in first.splitlines()}
    repeats = []
    for line in added:
        event = json.loads(line)["event"]
        if event in said:
            repeats.append(line)
        said.add(event)
    assert not repeats, f"{len(repeats)} repeated lines in the second {OUTAGE_WINDOW_SECONDS}s (first: " \
                        f"{first_lines}):\n" + "\n".join(added[-40:])
    assert len(added) <= 6, "the second window may only hold late first lines:\n" + "\n".join(added[-40:])

    client = await MemoryClient.connect(env.nats_url, env.settings.subject_prefix, timeout=10.0)
    for role in ("writer", "projector", "gateway"):
        await wait_for(lambda: leader_pid(client, role), timeout=120)
    await client.close()
