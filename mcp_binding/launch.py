"""Starting `pamledger mcp --transport http` as a child process and connecting to it as a given token: what the
tests and the benchmark do, and what an embedding program can do too."""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys
import threading
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any


class HttpProcess:
    """`python -m pamledger mcp --transport http --port 0 ARGS` with `env`; `url` is the URL it announced on
    stderr (everything it writes there goes to `log`)."""

    def __init__(self, env: dict[str, str], log: Path, *args: str, cwd: Path | None = None, timeout: float = 60.0):
        self.log_path = log
        self.proc = subprocess.Popen([sys.executable, "-m", "pamledger", "mcp", "--transport", "http", "--port", "0",
                                      *args], cwd=cwd, env=env, stdin=subprocess.DEVNULL,
                                     stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        self.url = ""
        self._ready = threading.Event()
        threading.Thread(target=self._read_stderr, daemon=True).start()
        if not self._ready.wait(timeout) or not self.url:
            self.stop()
            raise RuntimeError(f"pamledger mcp did not announce its URL: {log.read_text(errors='replace')[-2000:]}")

    def _read_stderr(self) -> None:
        assert self.proc.stderr is not None
        with self.log_path.open("ab") as log:
            for line in self.proc.stderr:
                log.write(line)
                log.flush()
                if not self.url:
                    with contextlib.suppress(ValueError, AttributeError):
                        announced = json.loads(line)
                        if announced.get("mcp") == "serving":
                            self.url = announced["url"]
                            self._ready.set()
        self._ready.set()

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


@contextlib.asynccontextmanager
async def http_session(url: str, token: str | None, message_handler: Any = None) -> AsyncIterator[Any]:
    """An initialized `mcp.ClientSession` to `url`, every request carrying `Authorization: Bearer <token>`;
    `message_handler` receives what the server sends unasked (notifications)."""
    import httpx2 as httpx
    from mcp import ClientSession
    from mcp.client.streamable_http import streamable_http_client

    headers = {"Authorization": f"Bearer {token}"} if token is not None else {}
    async with httpx.AsyncClient(headers=headers, timeout=httpx.Timeout(30.0, read=60.0)) as client:
        async with streamable_http_client(url, http_client=client) as streams:
            async with ClientSession(streams[0], streams[1], message_handler=message_handler) as session:
                await session.initialize()
                yield session
