"""Role names accepted by `pamledger run --roles` / `serve --roles`, and the watch on the servers run started."""

from __future__ import annotations

import time

import pytest
from structlog.testing import capture_logs

from local_servers.processes import ServerWatch
from pamledger.supervisor import ROLES, _revive_if_dead, parse_roles


def test_all_means_every_role_in_a_fixed_order() -> None:
    assert parse_roles("all") == ROLES == ("writer", "query", "projector", "indexer", "gateway")


def test_a_subset_keeps_the_canonical_order_and_ignores_blanks() -> None:
    assert parse_roles(" gateway, writer ,,") == ("writer", "gateway")


@pytest.mark.parametrize("text", ["", ",", "writer,searcher", "Writer"])
def test_unknown_or_empty_role_lists_are_refused(text: str) -> None:
    with pytest.raises(ValueError, match="unknown role"):
        parse_roles(text)


class FakeServer:
    """A server the watch sees: dies when told, comes back after `failures` failed starts."""

    def __init__(self, failures: int = 0) -> None:
        self.up, self.failures, self.starts = True, failures, 0

    def revive(self) -> None:
        self.starts += 1
        if self.failures:
            self.failures -= 1
            raise RuntimeError("port busy\nlog tail")
        self.up = True


def _watch(server: FakeServer) -> ServerWatch:
    return ServerWatch("nats", lambda: server.up, server.revive)


def test_a_live_server_is_left_alone() -> None:
    server = FakeServer()
    with capture_logs() as logs:
        _revive_if_dead(_watch(server), now=1.0)
    assert (server.starts, logs) == (0, [])


def test_a_dead_server_is_restarted_at_once_with_one_line_per_change() -> None:
    server = FakeServer()
    watch = _watch(server)
    server.up = False
    with capture_logs() as logs:
        _revive_if_dead(watch, now=1.0)
        _revive_if_dead(watch, now=1.1)
    assert server.starts == 1 and watch.down_since is None
    assert [entry["event"] for entry in logs] == ["supervisor.server_died", "supervisor.server_restarted"]


def test_failed_restarts_back_off_and_log_a_repeated_error_once() -> None:
    server = FakeServer(failures=3)
    watch = _watch(server)
    server.up = False
    with capture_logs() as logs:
        _revive_if_dead(watch, now=time.monotonic())
        _revive_if_dead(watch, now=time.monotonic())  # inside the backoff: no new attempt
        assert server.starts == 1
        while server.starts < 4:
            _revive_if_dead(watch, now=watch.not_before)
    assert server.up and watch.attempts == 0
    events = [entry["event"] for entry in logs]
    assert events == ["supervisor.server_died", "supervisor.server_restart_failed", "supervisor.server_restarted"]
    assert logs[1]["error"] == "RuntimeError: port busy"
