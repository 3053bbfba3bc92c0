"""The local NATS of a state dir as one server or as a JetStream cluster of N nodes on loopback.

Node 1 keeps the single server's place (`<state_dir>/nats`, its configuration file with the users of
authz.nats_auth); nodes 2..N store under `<state_dir>/nats-2` ... and read node 1's configuration, so
users and permissions are the same on every node and a reload reaches them all. servers.json records
every node's client and route ports, so a node restarted after a crash rejoins on the same ports with
the same store and server name, and catches up from its peers.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import structlog

from local_servers.nats_server import CONFIG_FILE, ClusterRoute, NatsServer, is_nats_process, launch_nats, nats_info
from local_servers.nats_server import store_holder
from schemas.errors import PamledgerError

log = structlog.get_logger(__name__)

CLUSTER_NAME = "pamledger"
MAX_NODES = 7  # settings.NatsSettings.nodes


class NodesChanged(PamledgerError):
    """The state dir's NATS runs with another number of nodes than asked: stop it first (`pamledger down`)."""

    code = "invalid_request"


def node_name(index: int) -> str:
    """`nats` for node 1 (the single server's name, so one node is exactly today's), `nats-2` ... after it."""
    return "nats" if index == 0 else f"nats-{index + 1}"


def node_dir(state_dir: Path, index: int) -> Path:
    return state_dir / node_name(index)


def config_file(state_dir: Path) -> Path:
    """The one configuration every node reads (written by pamledger.nats_users)."""
    return node_dir(state_dir, 0) / CONFIG_FILE


def routes(state_dir: Path, cluster_ports: list[int]) -> list[ClusterRoute]:
    """Each node's route: its stable server name, its route port and every other node's."""
    return [ClusterRoute(CLUSTER_NAME, f"{CLUSTER_NAME}-{node_name(index)}", port,
                         tuple(p for p in cluster_ports if p != port))
            for index, port in enumerate(cluster_ports)]


def recorded_nodes(recorded: dict[str, Any]) -> list[dict[str, Any]]:
    """The nodes servers.json records (a record from before clusters: its single server as node 1)."""
    nodes = recorded.get("nats_nodes")
    if isinstance(nodes, list) and all(isinstance(node, dict) for node in nodes):
        return nodes
    if "nats_port" in recorded:
        return [{"port": recorded.get("nats_port"), "pid": recorded.get("nats_pid")}]
    return []


def running_node(state_dir: Path, index: int, record: dict[str, Any] | None) -> NatsServer | None:
    """The nats-server that runs node `index` (as recorded, or holding its store) and answers, else None."""
    data_dir = node_dir(state_dir, index)
    port, pid = (record or {}).get("port"), (record or {}).get("pid")
    found = None
    if isinstance(port, int) and isinstance(pid, int) and is_nats_process(pid, port):
        found = NatsServer(port=port, data_dir=data_dir, pid=pid)
    found = found or store_holder(data_dir)
    return found if found is not None and nats_info(found.port) is not None else None


def up_cluster(state_dir: Path, recorded: dict[str, Any], count: int,
               port_for: Callable[[object], int]) -> tuple[list[NatsServer], set[str]]:
    """Reuse the cluster's running nodes, start the missing ones on their recorded ports (when free) with
    their stores; return the nodes and the names of those started here.

    A cluster whose node count differs from `count` is refused while any of it runs: adding a node to a
    running cluster, or turning a lone server into a cluster node, takes a stop first."""
    records = recorded_nodes(recorded)
    running = [running_node(state_dir, index, records[index] if index < len(records) else None)
               for index in range(max(count, len(records)))]
    live = [index for index, node in enumerate(running) if node is not None]
    if live and (len(records) != count or any(not isinstance(r.get("cluster_port"), int) for r in records)):
        raise NodesChanged(f"the NATS of {state_dir} runs with {len(records)} node(s), not {count}: stop it"
                           " (`pamledger down`), then start again with the new nats.nodes")
    cluster_ports = [port_for(records[index].get("cluster_port") if index < len(records) else None)
                     for index in range(count)]
    nodes: list[NatsServer] = []
    started: set[str] = set()
    for index, route in enumerate(routes(state_dir, cluster_ports)):
        node = running[index]
        if node is not None:
            nodes.append(replace(node, name=node_name(index), cluster=route, config_file=config_file(state_dir)))
            log.info("nats.reused", node=node_name(index), pid=node.pid, port=node.port)
            continue
        port = port_for(records[index].get("port") if index < len(records) else None)
        node = launch_nats(node_dir(state_dir, index), port, route, config_file(state_dir))
        nodes.append(replace(node, name=node_name(index)))
        started.add(node_name(index))
    return nodes, started


def node_records(nodes: list[NatsServer]) -> list[dict[str, Any]]:
    """What servers.json keeps of each node, so `up` finds and restarts it in place."""
    return [{"name": node.name, "port": node.port, "pid": node.pid, "data_dir": str(node.data_dir),
             "cluster_port": node.cluster.port if node.cluster is not None else None} for node in nodes]


def revive_node(node: NatsServer) -> NatsServer:
    """Bring a dead node back on its port, store and route (it rejoins and catches up), or adopt the
    nats-server that already came back there."""
    holder = store_holder(node.data_dir)
    if holder is not None and holder.port == node.port and nats_info(holder.port) is not None:
        return replace(holder, name=node.name, cluster=node.cluster, config_file=node.config_file)
    revived = launch_nats(node.data_dir, node.port, node.cluster, node.config_file)
    return replace(revived, name=node.name)


def cluster_url(nodes: list[NatsServer]) -> str:
    """Every node's client URL, comma-separated: what PAMLEDGER_NATS_URL and servers.json carry."""
    return ",".join(node.url for node in nodes)


def start_cluster(root: Path, count: int, port_for: Callable[[], int]) -> list[NatsServer]:
    """A fresh JetStream cluster of `count` nodes under `root` (tests, benchmarks): the nodes `up` would
    start, without a state dir's records."""
    client_ports = [port_for() for _ in range(count)]
    nodes: list[NatsServer] = []
    try:
        for index, route in enumerate(routes(root, [port_for() for _ in range(count)])):
            node = launch_nats(node_dir(root, index), client_ports[index], route, config_file(root))
            nodes.append(replace(node, name=node_name(index)))
    except BaseException:
        for node in nodes:
            node.stop()
        raise
    return nodes
