"""`pamledger run` says `"serving": true` only once every role answers: a create sent at that moment, with no
retry, is answered (it used to print the line seconds before the roles subscribed: NoRespondersError)."""

from __future__ import annotations

import asyncio
import json
import signal
import sys
from pathlib import Path
from typing import Any

from pamledger_client.client import MemoryClient
from pamledger.readiness import silent
from tests.conftest import ACTOR, PROVENANCE, Env, service_environment

ROOT = Path(__file__).resolve().parents[2]
SCOPE = "workspace:ready"


async def _lines_until_serving(stream: asyncio.StreamReader, timeout: float) -> list[dict[str, Any]]:
    seen: list[dict[str, Any]] = []
    async with asyncio.timeout(timeout):
        while True:
            raw = await stream.readline()
            assert raw, f"run ended before serving: {seen[-5:]}"
            try:
                line = json.loads(raw)
            except ValueError:
                continue
            if isinstance(line, dict) and "serving" in line:
                seen.append(line)
                if line["serving"] is True:
                    return seen


async def test_serving_is_said_once_every_role_answers(env: Env) -> None:
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "pamledger", "run", cwd=ROOT, env=service_environment(env),
        stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE)
    try:
        assert proc.stderr is not None
        said = await _lines_until_serving(proc.stderr, timeout=120)
        client = await MemoryClient.connect(env.nats_url, env.settings.subject_prefix)
        client.retries = 0  # the first request must find its responder: no retry to hide a missing one
        try:
            assert (await client.create_scope(SCOPE))["scope_id"] == SCOPE
            created = await client.create(SCOPE, "claim", {"statement": "ready"}, ACTOR, PROVENANCE)
            assert created["version_id"]
            for role in ("query", "projector", "gateway", "indexer", "writer"):
                assert (await client.status(role))
        finally:
            await client.close()
    finally:
        proc.send_signal(signal.SIGINT)
        await asyncio.wait_for(proc.wait(), 60)
    assert said[0]["starting"] is True and said[0]["serving"] is False
    assert said[-1]["roles"] == ["writer", "query", "projector", "indexer", "gateway"]


def test_silent_names_the_roles_that_did_not_answer() -> None:
    assert silent(["writer", "query", "gateway"], [True, False, False]) == ["query", "gateway"]
    assert silent([], []) == []
