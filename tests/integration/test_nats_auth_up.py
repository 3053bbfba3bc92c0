"""`pamledger up` writes the NATS users and starts NATS with them; `pamledger status` (an operator tool that
reads the stream) logs in as the service; PAMLEDGER_AUTH__MODE=off gives today's open NATS back (a reload).

Why: the README's commands run against exactly this server, so they must work through its permissions.
"""

from __future__ import annotations

import asyncio
import json
import os
import stat
import subprocess
import sys
from pathlib import Path
from typing import Any

import nats
import pytest

from authz.bootstrap import read_token
from authz.nats_auth import SERVICE_USER, agent_login, config_path
from authz.tokens import token_id_of
from tests.conftest import ROOT


def _pamledger(state: Path, *args: str, mode: str = "enforce") -> subprocess.CompletedProcess[str]:
    environment = {k: v for k, v in os.environ.items() if not k.startswith("PAMLEDGER_")}
    environment.update(PAMLEDGER_STATE_DIR=str(state), PAMLEDGER_AUTH__MODE=mode, PAMLEDGER_LOG_FORMAT="json")
    return subprocess.run([sys.executable, "-m", "pamledger", *args], cwd=ROOT, env=environment,
                          capture_output=True, text=True, timeout=180)


async def _connects(url: str, **options: Any) -> bool:
    try:
        nc = await nats.connect(url, max_reconnect_attempts=1, allow_reconnect=False, connect_timeout=2, **options)
    except nats.errors.Error:
        return False
    await nc.close()
    return True


async def test_up_starts_nats_with_its_users_and_off_opens_it_again(tmp_path: Path) -> None:
    state = tmp_path / "state"
    try:
        up = _pamledger(state, "up")
        assert up.returncode == 0, up.stderr
        url = json.loads(up.stdout)["nats_url"]
        path = config_path(state)
        assert stat.S_IMODE(path.stat().st_mode) == 0o600
        admin = read_token(state / "admin.token")
        assert admin is not None
        users = {u["user"] for u in json.loads(path.read_text())["authorization"]["users"]}
        assert users == {SERVICE_USER, token_id_of(admin)}
        assert not await _connects(url)  # anonymous
        assert await _connects(url, **agent_login(admin).options())  # type: ignore[union-attr]

        status = _pamledger(state, "status")  # no roles run: exit 1, but NATS and the stream report answer
        report = json.loads(status.stdout)
        assert report["nats"]["answers"] is True, status.stderr
        assert "ermission" not in status.stdout + status.stderr

        again = _pamledger(state, "up", mode="off")  # reuses the running NATS, rewrites and reloads it
        assert again.returncode == 0, again.stderr
        assert "authorization" not in json.loads(path.read_text())
        async def anonymous_again() -> bool:
            for _ in range(100):
                if await _connects(url):
                    return True
                await asyncio.sleep(0.1)
            return False
        assert await anonymous_again()
    finally:
        cleaned = _pamledger(state, "clean")
        assert cleaned.returncode == 0, cleaned.stderr
