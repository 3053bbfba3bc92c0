"""Local NATS + PostgreSQL for `pamledger up/run --local` and tests: start, reuse, record, stop.

One state dir holds both servers (`nats/`, `postgres/`) and `servers.json`, which records what runs so
a later `up` reuses live servers and a later `down` stops them. servers.json is removed only once no
server it could name still runs, and data is deleted only by an explicit `clean`.
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import json
import shutil
import socket
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import structlog

from infra.endpoints import SERVERS_FILE, read_servers_file
from local_servers.nats_cluster import (
    MAX_NODES, NodesChanged, cluster_url, node_dir, node_records, recorded_nodes, revive_node, up_cluster,
)
from local_servers.nats_server import NatsServer, StoreInUse, is_nats_process, launch_nats, nats_info, store_holder
from local_servers.postgres_server import (
    PostgresServer,
    attach_postgres,
    claimed_postgres,
    launch_postgres,
    launch_replica,
    layout_for,
    postgres_answers,
    remove_postgres_data,
)
from local_servers.processes import ServerWatch
from schemas.errors import PamledgerError

__all__ = [
    "LocalStack", "NatsServer", "NodesChanged", "PostgresServer", "ServerHandle", "ServersStillRunning", "StackStatus",
    "StoreInUse", "clean", "free_port", "read_servers_file", "reload_nats", "start_nats", "start_postgres", "status",
    "stop_from_file",
]

log = structlog.get_logger(__name__)


class ServerHandle(Protocol):
    """What every local server handle offers."""

    @property
    def name(self) -> str: ...
    @property
    def url(self) -> str: ...
    @property
    def port(self) -> int: ...
    @property
    def pid(self) -> int: ...
    @property
    def data_dir(self) -> Path: ...
    def stop(self) -> None: ...


def free_port() -> int:
    """Return a TCP port on 127.0.0.1 that is free right now (the kernel's choice)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def port_is_free(port: int) -> bool:
    """Tell whether 127.0.0.1:port can be bound now, so a recorded port is reused only when safe."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def start_nats(data_dir: Path, port: int | None = None) -> NatsServer:
    """Start nats-server with JetStream on 127.0.0.1 (a free port unless given), store under data_dir."""
    return launch_nats(data_dir, port if port is not None else free_port())


def start_postgres(data_dir: Path, port: int | None = None) -> PostgresServer:
    """Start PostgreSQL+pgvector on 127.0.0.1 (a free port unless given), initialising data_dir once."""
    return launch_postgres(data_dir, port if port is not None else free_port())


@contextlib.contextmanager
def _state_lock(state_dir: Path) -> Iterator[None]:
    """Serialise up/down on one state dir, so two callers never start the same servers twice."""
    state_dir.mkdir(parents=True, exist_ok=True)
    with (state_dir / ".lock").open("w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        yield


def _reusable_port(recorded: object) -> int | None:
    """The recorded port if it is still free, else None (meaning: pick a new one)."""
    return recorded if isinstance(recorded, int) and port_is_free(recorded) else None


def _recorded_nats(state_dir: Path, recorded: dict[str, Any]) -> NatsServer | None:
    """The nats-server servers.json names if that pid still is one on the recorded port, else None."""
    port, pid = recorded.get("nats_port"), recorded.get("nats_pid")
    if isinstance(port, int) and isinstance(pid, int) and is_nats_process(pid, port):
        return NatsServer(port=port, data_dir=state_dir / "nats", pid=pid)
    return None


def _up_nats(state_dir: Path, recorded: dict[str, Any]) -> tuple[NatsServer, bool]:
    """Reuse the recorded NATS, or the one holding our store, if it answers; else start one (and say so).

    A store held by a server that does not answer makes start_nats raise StoreInUse: never two on one store.
    """
    running = _recorded_nats(state_dir, recorded) or store_holder(state_dir / "nats")
    if running is not None and nats_info(running.port) is not None:
        log.info("nats.reused", pid=running.pid, port=running.port)
        return running, False
    return start_nats(state_dir / "nats", _reusable_port(recorded.get("nats_port"))), True


REPLICA_DIR = "postgres-replica"  # a streaming replica's data beside the primary's (`up --pg-replica`)


def _up_replica(state_dir: Path, recorded: dict[str, Any], primary: PostgresServer) -> tuple[PostgresServer, bool]:
    """Reuse the replica already serving our replica dir, else copy the primary into it (once) and start it."""
    running = attach_postgres(state_dir / REPLICA_DIR)
    if running is not None:
        log.info("postgres.replica_reused", pid=running.pid, port=running.port)
        running.name = "replica"
        return running, False
    port = _reusable_port(recorded.get("replica_port"))
    return launch_replica(primary.port, state_dir / REPLICA_DIR, port if port is not None else free_port()), True


def _up_nats_nodes(state_dir: Path, recorded: dict[str, Any], count: int) -> tuple[list[NatsServer], set[str]]:
    """One server as always (count 1), or the nodes of a local JetStream cluster (local_servers.nats_cluster)."""
    if count > 1:
        return up_cluster(state_dir, recorded, count, lambda port: _reusable_port(port) or free_port())
    if len(recorded_nodes(recorded)) > 1 and _recorded_nats(state_dir, recorded) is not None:
        raise NodesChanged(f"the NATS of {state_dir} runs as a cluster of {len(recorded_nodes(recorded))} nodes:"
                           " stop it (`pamledger down`), then start again with nats.nodes 1")
    nats, started = _up_nats(state_dir, recorded)
    return [nats], {"nats"} if started else set()


def _up_postgres(state_dir: Path, recorded: dict[str, Any]) -> tuple[PostgresServer, bool]:
    """Reuse the postmaster already serving our data dir, else start one; say whether we started it."""
    data_dir = state_dir / "postgres"
    running = attach_postgres(data_dir)
    if running is not None:
        log.info("postgres.reused", pid=running.pid, port=running.port)
        return running, False
    return start_postgres(data_dir, _reusable_port(recorded.get("postgres_port"))), True


class ServersStillRunning(PamledgerError):
    """`clean` refuses to delete a state dir whose servers it could not stop (the CLI's error envelope)."""

    code = "service_unavailable"


class ServersStopped(RuntimeError):
    """The servers were stopped on purpose (`down`, `clean`): a watch must not bring them back."""


@dataclass
class LocalStack:
    """NATS + PostgreSQL (and, asked for, a streaming replica of it) under one state dir, recorded in servers.json."""

    state_dir: Path
    nats_nodes: list[NatsServer]  # one server by default; the nodes of a JetStream cluster with nats.nodes > 1
    postgres: PostgresServer
    started: frozenset[str]
    replica: PostgresServer | None = None

    @classmethod
    def up(cls, state_dir: Path, nats_nodes: int = 1, pg_replica: bool = False) -> LocalStack:
        """Reuse live recorded servers, start the missing ones (same data, same ports when free). `nats_nodes`:
        one server, or a local JetStream cluster of that many nodes. `pg_replica`: also a streaming read replica
        of the Postgres (docs/scaling.md), recorded as `database_read_urls`."""
        with _state_lock(state_dir):
            recorded = read_servers_file(state_dir) or {}
            nodes, nats_started = _up_nats_nodes(state_dir, recorded, nats_nodes)
            replica, replica_started = None, False
            try:
                postgres, pg_started = _up_postgres(state_dir, recorded)
                if pg_replica:
                    replica, replica_started = _up_replica(state_dir, recorded, postgres)
            except BaseException:
                for node in nodes:
                    if node.name in nats_started:
                        node.stop()
                raise
            started = frozenset(nats_started | {name for name, was_started in (("postgres", pg_started),
                                                                               ("replica", replica_started))
                                                 if was_started})
            stack = cls(state_dir, nodes, postgres, started, replica)
            stack.write_servers_file()
        log.info("stack.up", state_dir=str(state_dir), started=sorted(stack.started),
                 nats_url=stack.nats_url, database_url=postgres.url)
        return stack

    @property
    def nats(self) -> NatsServer:
        """Node 1: the single server when there is one."""
        return self.nats_nodes[0]

    @property
    def nats_url(self) -> str:
        """Every node's client URL, comma-separated (one URL for a single server)."""
        return cluster_url(self.nats_nodes)

    @property
    def reused(self) -> bool:
        """True when this call started nothing (both servers were already running)."""
        return not self.started

    def write_servers_file(self) -> None:
        """Atomically record both servers in servers.json."""
        record = {
            "nats_url": self.nats_url, "nats_port": self.nats.port, "nats_pid": self.nats.pid,
            "nats_data_dir": str(self.nats.data_dir), "nats_nodes": node_records(self.nats_nodes),
            "database_url": self.postgres.url, "postgres_port": self.postgres.port,
            "postgres_pid": self.postgres.pid, "postgres_data_dir": str(self.postgres.data_dir),
            "postgres_run_as": self.postgres.layout.run_as, "updated_at": time.time(),
        }
        if self.replica is not None:
            record.update({"database_read_urls": [self.replica.url], "replica_port": self.replica.port,
                           "replica_pid": self.replica.pid, "replica_data_dir": str(self.replica.data_dir)})
        temporary = self.state_dir / (SERVERS_FILE + ".tmp")
        temporary.write_text(json.dumps(record, indent=2) + "\n")
        temporary.replace(self.state_dir / SERVERS_FILE)

    def stop(self) -> None:
        """Stop every server and remove servers.json."""
        self._stop({node.name for node in self.nats_nodes} | {"postgres", "replica"})

    def stop_started(self) -> None:
        """Stop only what this stack started (what `run --local` should undo), keeping reused servers."""
        self._stop(set(self.started))

    def _stop(self, names: set[str]) -> None:
        """Stop the named servers (Postgres last, it is slower); forget servers.json once nothing runs."""
        with _state_lock(self.state_dir):
            for node in self.nats_nodes:
                if node.name in names:
                    node.stop()
            if "replica" in names and self.replica is not None:
                self.replica.stop()
            if "postgres" in names:
                self.postgres.stop()
            _forget_if_all_stopped(self.state_dir)
        log.info("stack.stopped", state_dir=str(self.state_dir), stopped=sorted(names))

    def watches(self) -> list[ServerWatch]:
        """One watch per server this stack started, for the supervisor to restart it in place."""
        return [ServerWatch(name, functools.partial(self._alive, name), functools.partial(self.revive, name))
                for name in sorted(self.started)]

    def _alive(self, name: str) -> bool:
        if name == "postgres":
            return self.postgres.is_alive()
        if name == "replica":
            return self.replica is None or self.replica.is_alive()
        return self._node(name).is_running()

    def _node(self, name: str) -> NatsServer:
        return next(node for node in self.nats_nodes if node.name == name)

    def revive(self, name: str) -> None:
        """Bring a dead server back on its data dir and port, or adopt one that already came back there.

        Not after `down` or `clean`: they remove servers.json, a crash does not.
        """
        if not (self.state_dir / SERVERS_FILE).is_file():
            raise ServersStopped(f"servers.json is gone from {self.state_dir}: stopped on purpose, not restarting")
        with _state_lock(self.state_dir):
            if not (self.state_dir / SERVERS_FILE).is_file():
                raise ServersStopped(f"servers.json is gone from {self.state_dir}: stopped on purpose")
            if name == "nats" and len(self.nats_nodes) == 1:
                holder = store_holder(self.nats.data_dir)
                if holder is not None and holder.port == self.nats.port and nats_info(holder.port) is not None:
                    self.nats_nodes, self.started = [holder], self.started - {"nats"}  # someone else's now
                else:
                    self.nats_nodes = [launch_nats(self.nats.data_dir, self.nats.port)]
            elif name == "replica" and self.replica is not None:
                self._revive_replica(self.replica.port)
            elif name != "postgres":
                index = self.nats_nodes.index(self._node(name))
                node = revive_node(self.nats_nodes[index])
                self.nats_nodes[index] = node
                if node.process is None:  # adopted: it came back by another hand
                    self.started = self.started - {name}
            else:
                running = attach_postgres(self.state_dir / "postgres")
                if running is not None and running.port == self.postgres.port:
                    self.postgres, self.started = running, self.started - {"postgres"}
                else:
                    self.postgres = launch_postgres(self.state_dir / "postgres", self.postgres.port, initialise=False)
            self.write_servers_file()


    def _revive_replica(self, port: int) -> None:
        """The replica back on its data and port (never copied afresh here: its data dir is kept)."""
        running = attach_postgres(self.state_dir / REPLICA_DIR)
        if running is not None and running.port == port:
            running.name = "replica"
            self.replica, self.started = running, self.started - {"replica"}
        else:
            self.replica = launch_replica(self.postgres.port, self.state_dir / REPLICA_DIR, port)


def reload_nats(state_dir: Path) -> bool:
    """Have the state dir's running NATS read its configuration again; False when none runs."""
    reloaded = [node.reload() for node in _live_nats(state_dir)]
    return bool(reloaded) and all(reloaded)


def _live_nats(state_dir: Path) -> list[NatsServer]:
    """Every nats-server of the state dir that runs: the recorded node(s), or whatever holds their stores."""
    recorded = read_servers_file(state_dir) or {}
    found: list[NatsServer] = []
    stores = sum(1 for index in range(1, MAX_NODES) if node_dir(state_dir, index).is_dir())  # servers.json gone
    count = max(len(recorded_nodes(recorded)), 1 + stores)
    candidates = [_recorded_nats(state_dir, recorded)]
    for index, record in enumerate(recorded_nodes(recorded)):
        port, pid = record.get("port"), record.get("pid")
        if index and isinstance(port, int) and isinstance(pid, int) and is_nats_process(pid, port):
            candidates.append(NatsServer(port=port, data_dir=node_dir(state_dir, index), pid=pid))
    candidates += [store_holder(node_dir(state_dir, index)) for index in range(count)]
    for nats in candidates:
        if nats is not None and nats.is_running() and all(nats.pid != other.pid for other in found):
            found.append(nats)
    return found


def _live_servers(state_dir: Path) -> list[Any]:
    """Every server servers.json names, or that holds the state dir's stores, and still runs."""
    found: list[Any] = list(_live_nats(state_dir))
    for directory in (REPLICA_DIR, "postgres"):  # the replica first: stopped before its primary
        postgres = claimed_postgres(state_dir / directory)
        if postgres is not None and postgres.is_alive():
            found.append(postgres)
    return found


def _forget_if_all_stopped(state_dir: Path) -> None:
    """Remove servers.json only when no server it could name still runs: a live server is never forgotten."""
    live = _live_servers(state_dir)
    if live:
        log.info("stack.record_kept", state_dir=str(state_dir), running=[(s.name, s.pid) for s in live])
        return
    (state_dir / SERVERS_FILE).unlink(missing_ok=True)


def stop_from_file(state_dir: Path) -> None:
    """Stop whatever servers.json names or holds the state dir's stores, then remove servers.json."""
    with _state_lock(state_dir):
        for server in _live_servers(state_dir):
            server.stop()
        _forget_if_all_stopped(state_dir)
    log.info("stack.stopped", state_dir=str(state_dir))


def clean(state_dir: Path) -> None:
    """Stop the servers, then delete the state dir and its Postgres mirror: the only way data is deleted."""
    stop_from_file(state_dir)
    live = _live_servers(state_dir)
    if live:
        named = ", ".join(f"{s.name} pid {s.pid}" for s in live)
        raise ServersStillRunning(f"not deleting {state_dir}: servers still run and could not be stopped ({named});"
                                  " stop them, then clean again", details={
                                      "state_dir": str(state_dir), "running": [{"server": s.name, "pid": s.pid}
                                                                              for s in live]})
    if (state_dir / REPLICA_DIR).exists():
        remove_postgres_data(layout_for(state_dir / REPLICA_DIR))
    remove_postgres_data(layout_for(state_dir / "postgres"))
    shutil.rmtree(state_dir, ignore_errors=True)
    log.info("stack.cleaned", state_dir=str(state_dir))


@dataclass(frozen=True)
class StackStatus:
    """Whether the recorded servers answer (TCP+INFO for NATS, SELECT 1 for Postgres)."""

    recorded: bool
    nats_url: str | None
    database_url: str | None
    nats_answers: bool
    postgres_answers: bool

    @property
    def all_up(self) -> bool:
        """True when both servers answer."""
        return self.nats_answers and self.postgres_answers


def status(state_dir: Path) -> StackStatus:
    """Report whether the servers recorded in state_dir answer."""
    recorded = read_servers_file(state_dir)
    if recorded is None:
        return StackStatus(False, None, None, False, False)
    nats_port, database_url = recorded.get("nats_port"), recorded.get("database_url")
    return StackStatus(
        recorded=True, nats_url=recorded.get("nats_url"), database_url=database_url,
        nats_answers=isinstance(nats_port, int) and nats_info(nats_port) is not None,
        postgres_answers=isinstance(database_url, str) and postgres_answers(database_url),
    )
