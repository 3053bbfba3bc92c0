"""The service under test, started as a user would: `pamledger run` in a fresh state dir, auth enforced.

Why a subprocess: the kills must be real kills of real processes, and `run` is what supervises and restarts
them (pamledger/supervisor.py); the soak only ever sees it from outside, through NATS, SQL and the CLI.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from authz.bootstrap import read_token
from infra.endpoints import read_servers_file
from local_servers.launch import clean

ROOT = Path(__file__).resolve().parents[1]


@dataclass
class Service:
    """A running `pamledger run`: its process, state dir and log file."""

    proc: subprocess.Popen[bytes]
    state: Path
    log_path: Path
    env: dict[str, str]

    def servers(self) -> dict[str, Any] | None:
        return read_servers_file(self.state)

    def admin_token(self) -> str | None:
        return read_token(self.state / "admin.token")

    def cli(self, *args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
        """`pamledger ARGS` against this service (its state dir names the servers and the admin token)."""
        return subprocess.run([sys.executable, "-m", "pamledger", *args], cwd=ROOT, env=self.env,
                              capture_output=True, text=True, timeout=timeout)


def start(workdir: Path, space: str) -> Service:
    """`pamledger run` on `workdir`/state, its JSON log in `workdir`/run.log; no PAMLEDGER_ variable leaks in."""
    state, log_path = workdir / "state", workdir / "run.log"
    env = {key: value for key, value in os.environ.items() if not key.startswith("PAMLEDGER_")}
    env.update(PAMLEDGER_STATE_DIR=str(state), PAMLEDGER_LOG_FORMAT="json", PAMLEDGER_INDEXER__DEFAULT_SPACE=space)
    with log_path.open("ab") as log:
        proc = subprocess.Popen([sys.executable, "-m", "pamledger", "run"], cwd=ROOT, env=env, stdout=log,
                                stderr=log, stdin=subprocess.DEVNULL)
    return Service(proc, state, log_path, env)


def stop(service: Service) -> None:
    """Interrupt `run` (it stops its roles and servers), then remove the state dir's servers and data."""
    if service.proc.poll() is None:
        service.proc.send_signal(signal.SIGINT)
        try:
            service.proc.wait(timeout=90)
        except subprocess.TimeoutExpired:
            service.proc.kill()
            service.proc.wait()
    clean(service.state)
