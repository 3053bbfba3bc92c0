"""Services under test as child processes: start, wait until they answer on NATS, measure RSS, stop.

Children run in their own session (Ctrl-C on the terminal reaches only the benchmark, which then stops
them in order) and get SIGTERM from the kernel if the benchmark dies without cleaning up.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any

from nats.aio.client import Client as NATS
import psutil  # type: ignore[import-untyped]
from nats.errors import NoRespondersError, TimeoutError as NatsTimeout

from local_servers.processes import die_with_parent

PROJECT_ROOT = Path(__file__).resolve().parents[1]


class Child:
    """One service process with its output in a log file."""

    def __init__(self, name: str, argv: list[str], env: dict[str, str], log_path: Path):
        self.name = name
        self.argv = argv
        self.env = env
        self.log_path = log_path
        self.process: subprocess.Popen[bytes] | None = None
        self._log: IO[bytes] | None = None
        self.killed = False  # True when SIGTERM did not stop it in time (a shutdown bug worth reporting)

    def start(self) -> Child:
        self._log = self.log_path.open("wb")
        self.process = subprocess.Popen(
            self.argv, env={**os.environ, **self.env}, cwd=PROJECT_ROOT, stdin=subprocess.DEVNULL,
            stdout=self._log, stderr=subprocess.STDOUT, start_new_session=True, preexec_fn=die_with_parent,
        )
        return self

    @property
    def pid(self) -> int:
        assert self.process is not None
        return self.process.pid

    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def rss_bytes(self) -> int:
        return int(psutil.Process(self.pid).memory_info().rss)

    def cpu_seconds(self) -> float:
        """User + system CPU of the child and every process under it (`pamledger run` has one per role)."""
        return sum(self.cpu_by_process().values())

    def cpu_by_process(self) -> dict[str, float]:
        """CPU seconds per process of the tree, named by its `--roles` argument ('main' for the child)."""
        return tree_cpu(self.pid, lambda argv: argv[argv.index("--roles") + 1] if "--roles" in argv[:-1] else "main")

    def log_tail(self, lines: int = 30) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

    def stop(self, timeout: float = 10.0) -> None:
        """SIGTERM (the services drain and exit), then SIGKILL if it does not exit in time."""
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout)
            except subprocess.TimeoutExpired:
                self.killed = True
                self.process.kill()
                self.process.wait(timeout)
        if self._log is not None:
            self._log.close()
            self._log = None

    def __enter__(self) -> Child:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def python_child(name: str, module: str, env: dict[str, str], log_dir: Path, *args: str) -> Child:
    """`python -m module args...` with this interpreter."""
    return Child(name, [sys.executable, "-m", module, *args], env, log_dir / f"{name}.log")


async def wait_answering(nc: NATS, child: Child, subject: str, timeout: float = 60.0) -> Any:
    """Poll a request subject until the child answers; fail loudly (with its log) if it dies or stalls."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while loop.time() < deadline:
        if not child.alive():
            raise RuntimeError(f"{child.name} exited during startup:\n{child.log_tail()}")
        try:
            return await nc.request(subject, b"{}", timeout=0.5)
        except (NoRespondersError, NatsTimeout):
            await asyncio.sleep(0.05)
    raise TimeoutError(f"{child.name} did not answer on {subject} within {timeout}s:\n{child.log_tail()}")



def tree_cpu(pid: int, name: Callable[[list[str]], str] = lambda argv: "all") -> dict[str, float]:
    """User+system CPU seconds of a process and its living descendants, summed per `name(argv)` (a
    Postgres postmaster: its backends and background workers; a process that exited in between is not
    counted)."""
    root = psutil.Process(pid)
    out: dict[str, float] = {}
    for proc in [root, *root.children(recursive=True)]:
        try:
            times = proc.cpu_times()
            argv = proc.cmdline()
        except psutil.NoSuchProcess:
            continue
        key = name(argv)
        out[key] = out.get(key, 0.0) + times.user + times.system
    return out
