"""`pamledger status` sees every NATS node of a JetStream cluster, each partition's stream leader and replicas,
and each Postgres read replica: a node or a replica away is a problem (degraded) while the service serves on.

A 3-node cluster and a primary with a streaming replica of the module's own; the service (two partitions, R3
streams) runs in this event loop; status runs as the real CLI, as an operator runs it.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest

from infra.partitions import partition_of, partition_stream
from infra.settings import DatabaseSettings
from local_servers.nats_cluster import cluster_url
from local_servers.nats_server import NatsServer
from pamledger_client.client import MemoryClient
from tests.conftest import ACTOR, PROVENANCE, Env, Servers, fresh_settings, in_database, nats_cluster, \
    primary_and_replica, serving, service_environment, wait_for

ROOT = Path(__file__).resolve().parents[2]
PARTITIONS = 2
ROLES = ("writer", "query", "projector", "gateway")
DATABASE = "pamledger_status_cluster"


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[NatsServer]]:
    with nats_cluster(tmp_path_factory.mktemp("status-nats")) as nodes:
        yield nodes


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    with primary_and_replica(tmp_path_factory.mktemp("status-pg"), DATABASE) as handles:
        yield handles


@pytest.fixture(scope="module")
def status_env(cluster: list[NatsServer], pair: dict[str, Any]) -> Env:
    database = DatabaseSettings(read_urls=[in_database(pair["replica"].url, DATABASE)], replica_retry_seconds=0.2)
    return Env(Servers(cluster_url(cluster), pair["primary"].url), in_database(pair["primary"].url, DATABASE),
               fresh_settings("statuscluster", partitions=PARTITIONS, database=database))


@pytest.fixture(scope="module")
async def client(status_env: Env) -> AsyncIterator[MemoryClient]:
    async with serving(status_env, ROLES, roles=ROLES, timeout=90) as found:
        found.retries = 12
        yield found


def status(env: Env) -> tuple[int, dict[str, Any]]:
    """`pamledger status` against the module's cluster, primary and replica: (exit code, report)."""
    done = subprocess.run([sys.executable, "-m", "pamledger", "status"], cwd=ROOT, capture_output=True, text=True,
                          timeout=120, env=service_environment(
                              env, PAMLEDGER_PARTITIONS=str(PARTITIONS),
                              PAMLEDGER_DATABASE__READ_URLS=json.dumps(list(env.settings.database.read_urls))))
    assert done.stdout, done.stderr
    return done.returncode, json.loads(done.stdout)


async def status_in_thread(env: Env) -> tuple[int, dict[str, Any]]:
    return await asyncio.to_thread(status, env)  # the service answers from this event loop


def one_scope_per_partition() -> list[str]:
    found: dict[int, str] = {}
    i = 0
    while len(found) < PARTITIONS:
        found.setdefault(partition_of(f"workspace:status-{i}", PARTITIONS), f"workspace:status-{i}")
        i += 1
    return list(found.values())


async def replicated(client: MemoryClient, env: Env) -> bool:
    """Every partition's stream has a leader and two current replicas."""
    for p in range(PARTITIONS):
        try:
            info = await client.nc.jetstream().stream_info(partition_stream(env.settings.stream_name, p))
        except Exception:  # noqa: BLE001 - an election in progress: ask again
            return False
        peers = (info.cluster.replicas or []) if info.cluster is not None else []
        if not (info.cluster and info.cluster.leader and len(peers) == 2
                and all(r.current and not r.offline for r in peers)):
            return False
    return True


async def healthy(env: Env) -> dict[str, Any] | None:
    code, report = await status_in_thread(env)
    return report if code == 0 and not report["problems"] else None


async def test_status_reports_every_node_stream_and_replica_and_a_node_away_as_degraded(
        client: MemoryClient, status_env: Env, cluster: list[NatsServer], pair: dict[str, Any]) -> None:
    scopes = one_scope_per_partition()
    for scope_id in scopes:
        await client.create_scope(scope_id)
        await client.create(scope_id, "claim", {"n": 1}, ACTOR, PROVENANCE)
    await wait_for(lambda: replicated(client, status_env), timeout=60, interval=0.2)

    report = await wait_for(lambda: healthy(status_env), timeout=60, interval=0.5)
    names = {node.cluster.server_name for node in cluster if node.cluster is not None}
    nodes = report["nats"]["nodes"]
    assert [n["url"] for n in nodes] == [node.url for node in cluster]
    assert all(n["answers"] for n in nodes) and {n["server_name"] for n in nodes} == names, nodes
    streams = {s["stream"]: s for s in report["nats"]["streams"]}
    assert sorted(streams) == sorted(partition_stream(status_env.settings.stream_name, p) for p in range(PARTITIONS))
    for placement in streams.values():
        assert placement["replicas"] == 3 and placement["leader"] in names, placement
        assert {p["name"] for p in placement["peers"]} == names - {placement["leader"]}, placement
    assert sorted(s for n in nodes for s in n["leads"]) == sorted(streams)
    replicas = report["postgres"]["read_replicas"]
    assert [(r["answers"], r["in_recovery"]) for r in replicas] == [(True, True)], replicas
    # Every partition's ledger id against its stream's: each its own, and the stream names it.
    identities = report["ledger"]["partitions"]
    assert report["ledger"]["agrees"], report["ledger"]["problems"]
    assert sorted(identities) == [str(p) for p in range(PARTITIONS)]
    assert all(i["ledger_id"] == i["stream_ledger_id"] for i in identities.values()), identities
    assert len({i["ledger_id"] for i in identities.values()}) == PARTITIONS

    # A node away: status names it (degraded), while every role answers and writes go on.
    victim = next(node for node in cluster if node.cluster is not None
                  and node.cluster.server_name not in {p["leader"] for p in streams.values()}) \
        if any(not n["leads"] for n in nodes) else cluster[-1]
    victim.kill()
    try:
        code, report = await status_in_thread(status_env)
        assert code == 1, report
        away = [n for n in report["nats"]["nodes"] if not n["answers"]]
        assert [n["url"] for n in away] == [victim.url], report["nats"]["nodes"]
        assert any(f"NATS node {victim.url} does not answer" in p and p.startswith("degraded")
                   for p in report["problems"]), report["problems"]
        assert all(report[role]["answers"] for role in ROLES), {role: report[role] for role in ROLES}
        for scope_id in scopes:
            await client.create(scope_id, "claim", {"n": "node away"}, ACTOR, PROVENANCE)
    finally:
        victim.restart()
    await wait_for(lambda: replicated(client, status_env), timeout=90, interval=0.5)
    await wait_for(lambda: healthy(status_env), timeout=60, interval=0.5)


async def test_a_read_replica_away_is_shown_as_degraded_while_queries_are_answered(
        client: MemoryClient, status_env: Env, pair: dict[str, Any]) -> None:
    await wait_for(lambda: healthy(status_env), timeout=60, interval=0.5)
    pair["replica"].stop()
    code, report = await status_in_thread(status_env)
    assert code == 1, report
    replicas = report["postgres"]["read_replicas"]
    assert [r["answers"] for r in replicas] == [False], replicas
    assert any(p.startswith(f"degraded: read replica {replicas[0]['url']} does not answer")
               for p in report["problems"]), report["problems"]
    scope_id = one_scope_per_partition()[0]
    found = await client.query(scope_id, validation_states=["unverified"])
    assert found["items"], found  # the primary answers
