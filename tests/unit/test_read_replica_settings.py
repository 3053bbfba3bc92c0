"""Read replicas' settings and where they come from: the environment, or servers.json beside its own primary."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from infra.endpoints import SERVERS_FILE, resolve
from infra.settings import Settings
from query.replicas import Replica, shown_url


def test_read_urls_come_from_the_environment_as_a_json_list(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PAMLEDGER_DATABASE_URL", "postgresql://p@primary/db")
    monkeypatch.setenv("PAMLEDGER_DATABASE__READ_URLS", '["postgresql://p@replica/db"]')
    monkeypatch.setenv("PAMLEDGER_DATABASE__REPLICA_WAIT_MS", "50")
    settings = Settings()
    assert settings.database_url == "postgresql://p@primary/db"
    assert settings.database.read_urls == ["postgresql://p@replica/db"]
    assert settings.database.replica_wait_ms == 50


def test_no_read_urls_by_default() -> None:
    assert Settings().database.read_urls == []


def _recorded(state: Path) -> None:
    state.mkdir()
    (state / SERVERS_FILE).write_text(json.dumps({
        "nats_url": "nats://127.0.0.1:1", "database_url": "postgresql://postgres@127.0.0.1:2/postgres",
        "database_read_urls": ["postgresql://postgres@127.0.0.1:3/postgres"]}))


def test_the_recorded_replica_serves_the_recorded_primary(tmp_path: Path) -> None:
    _recorded(tmp_path / "state")
    found = resolve(Settings(state_dir=tmp_path / "state"))
    assert found.read_urls == ("postgresql://postgres@127.0.0.1:3/postgres",)


def test_a_primary_of_ones_own_never_gets_the_recorded_replica(tmp_path: Path) -> None:
    """A replica replays the primary it was copied from: read under another primary it would answer wrong."""
    _recorded(tmp_path / "state")
    found = resolve(Settings(state_dir=tmp_path / "state", database_url="postgresql://other/db"))
    assert found.read_urls == ()


def test_status_shows_a_replica_without_its_credentials() -> None:
    replica = Replica("postgresql://reader:s3cret@db-replica.internal:6432/pamledger?sslmode=require")
    report = replica.report()
    assert report["url"] == "db-replica.internal:6432/pamledger"
    assert "s3cret" not in json.dumps(report) and "reader" not in shown_url(replica.url)
    assert report["state"] == "starting"
