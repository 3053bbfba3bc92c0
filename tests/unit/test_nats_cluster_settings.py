"""The NATS servers a URL names, the ledger stream's replicas, a cluster's routes, and what a 503 answers."""

from __future__ import annotations

from pathlib import Path

import nats.js.errors
import pytest

from infra.nats_servers import StreamReplicas, server_urls, stream_replicas
from infra.request_shell import to_error
from infra.settings import Settings
from local_servers.nats_cluster import config_file, node_dir, routes

A, B, C = "nats://10.0.0.1:4222", "nats://10.0.0.2:4222", "nats://10.0.0.3:4222"


@pytest.mark.parametrize(("url", "servers"), [
    (A, [A]),
    (f"{A},{B},{C}", [A, B, C]),
    (f" {A} , {B},", [A, B]),
])
def test_a_comma_separated_url_names_every_server(url: str, servers: list[str]) -> None:
    assert server_urls(url) == servers


@pytest.mark.parametrize(("url", "configured", "wanted"), [
    (A, None, StreamReplicas(1)),
    (f"{A},{B},{C}", None, StreamReplicas(3)),
    (f"{A},{B},{C},{A},{B}", None, StreamReplicas(3)),  # five servers: still R3 unless set
    (A, 3, StreamReplicas(3, exact=True)),
    (f"{A},{B},{C}", 1, StreamReplicas(1, exact=True)),
])
def test_the_stream_has_a_replica_per_server_up_to_three_unless_set(url: str, configured: int | None,
                                                                       wanted: StreamReplicas) -> None:
    assert stream_replicas(url, configured) == wanted


def test_replicas_derived_from_the_urls_never_shrink_a_stream_and_set_ones_do() -> None:
    assert StreamReplicas(1).wanted(current=3) == 3  # a client given one node of the cluster
    assert StreamReplicas(3).wanted(current=1) == 3  # a stream made before the cluster
    assert StreamReplicas(1, exact=True).wanted(current=3) == 1


def test_nats_nodes_and_replicas_come_from_the_environment_beside_the_url(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PAMLEDGER_NATS_URL", f"{A},{B}")
    monkeypatch.setenv("PAMLEDGER_NATS__NODES", "3")
    monkeypatch.setenv("PAMLEDGER_NATS__STREAM_REPLICAS", "3")
    settings = Settings()
    assert (settings.nats_url, settings.nats.nodes, settings.nats.stream_replicas) == (f"{A},{B}", 3, 3)


def test_one_nats_node_is_the_default() -> None:
    assert (Settings().nats.nodes, Settings().nats.stream_replicas) == (1, None)


def test_each_node_routes_to_every_other_under_a_stable_name_and_reads_node_ones_configuration() -> None:
    state = Path("/state")
    found = routes(state, [7001, 7002, 7003])
    assert [r.server_name for r in found] == ["pamledger-nats", "pamledger-nats-2", "pamledger-nats-3"]
    assert [r.peers for r in found] == [(7002, 7003), (7001, 7003), (7001, 7002)]
    assert "routes: [\"nats://127.0.0.1:7002\", \"nats://127.0.0.1:7003\"]" in found[0].config(state / "nats", None)
    assert [node_dir(state, i) for i in range(3)] == [state / "nats", state / "nats-2", state / "nats-3"]
    assert config_file(state) == state / "nats" / "nats.conf"


def test_jetstream_without_a_leader_is_service_unavailable_not_an_internal_error() -> None:
    error = to_error(nats.js.errors.ServiceUnavailableError(), "poll")
    assert (error.code, error.retryable) == ("service_unavailable", True)
    refused = to_error(nats.js.errors.APIError(code=400, description="bad", err_code=10_000), "poll")
    assert refused.code == "internal_error"
