"""Real NATS and PostgreSQL started by local_servers.launch on free ports under a temp dir."""

from __future__ import annotations

import os
import shutil
import signal
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import nats
import psycopg
import pytest

from local_servers.nats_server import NatsServer, pid_alive
from local_servers.postgres_server import PostgresServer
from local_servers.launch import (
    LocalStack,
    clean,
    free_port,
    read_servers_file,
    start_nats,
    start_postgres,
    status,
    stop_from_file,
)


@pytest.fixture
def nats_server(tmp_path: Path) -> Iterator[NatsServer]:
    """A private nats-server, stopped at teardown."""
    server = start_nats(tmp_path / "nats")
    yield server
    server.stop()


@pytest.fixture
def postgres_server(tmp_path: Path) -> Iterator[PostgresServer]:
    """A private PostgreSQL, stopped and deleted (with any mirror) at teardown."""
    server = start_postgres(tmp_path / "postgres")
    yield server
    server.destroy()


@pytest.fixture
def state_dir(tmp_path: Path) -> Iterator[Path]:
    """A state dir whose servers are stopped and data cleaned at teardown."""
    path = tmp_path / "state"
    yield path
    clean(path)


async def _publish(url: str, count: int) -> None:
    """Create stream EVENTS and publish count acknowledged messages to it."""
    client = await nats.connect(url)
    try:
        js = client.jetstream()
        await js.add_stream(name="EVENTS", subjects=["events.>"])
        for index in range(count):
            await js.publish("events.test", str(index).encode())
    finally:
        await client.close()


async def _stream_messages(url: str) -> int:
    """Return how many messages stream EVENTS holds."""
    client = await nats.connect(url)
    try:
        info = await client.jetstream().stream_info("EVENTS")
        return info.state.messages
    finally:
        await client.close()


def test_free_port_is_bindable_and_not_the_shared_defaults() -> None:
    port = free_port()
    assert 1024 < port < 65536
    assert port not in (4222, 5432)


async def test_nats_starts_with_jetstream(nats_server: NatsServer) -> None:
    assert nats_server.url == f"nats://127.0.0.1:{nats_server.port}"
    assert nats_server.is_running()
    await _publish(nats_server.url, 5)
    assert await _stream_messages(nats_server.url) == 5


async def test_nats_kill_then_restart_keeps_stream(nats_server: NatsServer) -> None:
    await _publish(nats_server.url, 20)
    old_pid, port = nats_server.pid, nats_server.port
    nats_server.kill()
    assert not pid_alive(old_pid)
    nats_server.restart()
    assert nats_server.port == port
    assert nats_server.pid != old_pid
    assert await _stream_messages(nats_server.url) == 20


def test_nats_stop_escalates_nothing_when_already_dead(nats_server: NatsServer) -> None:
    os.kill(nats_server.pid, signal.SIGKILL)
    nats_server.stop()
    assert not nats_server.is_running()


def test_postgres_serves_sql_and_pgvector(postgres_server: PostgresServer) -> None:
    assert postgres_server.url == f"postgresql://postgres@127.0.0.1:{postgres_server.port}/postgres"
    with psycopg.connect(postgres_server.url, autocommit=True) as conn:
        assert conn.execute("SELECT 1").fetchone() == (1,)
        conn.execute("CREATE EXTENSION IF NOT EXISTS vector")
        row = conn.execute("SELECT '[1,2,3]'::vector <-> '[1,2,5]'::vector").fetchone()
        assert row is not None and row[0] == pytest.approx(2.0)
        assert conn.execute("SHOW fsync").fetchone() == ("on",)
        assert conn.execute("SHOW server_encoding").fetchone() == ("UTF8",)


def test_postgres_stop_refuses_connections(postgres_server: PostgresServer) -> None:
    postgres_server.stop()
    assert not postgres_server.is_running()
    with pytest.raises(psycopg.OperationalError):
        psycopg.connect(postgres_server.url, connect_timeout=2)


def test_postgres_keeps_data_across_restart(tmp_path: Path, postgres_server: PostgresServer) -> None:
    with psycopg.connect(postgres_server.url, autocommit=True) as conn:
        conn.execute("CREATE TABLE kept (x int)")
        conn.execute("INSERT INTO kept VALUES (42)")
    postgres_server.stop()
    again = start_postgres(tmp_path / "postgres")
    with psycopg.connect(again.url) as conn:
        assert conn.execute("SELECT x FROM kept").fetchone() == (42,)


@pytest.mark.skipif(os.geteuid() != 0, reason="root-only layout")
def test_postgres_as_root_runs_as_system_user(postgres_server: PostgresServer) -> None:
    assert postgres_server.layout.run_as == "pamledger-pg"
    assert str(postgres_server.data_dir).startswith("/var/lib/pamledger/pamledger-")
    status_line = Path(f"/proc/{postgres_server.pid}/status").read_text()
    uid = int(next(line for line in status_line.splitlines() if line.startswith("Uid:")).split()[1])
    assert uid != 0


@pytest.mark.skipif(os.geteuid() != 0, reason="root-only layout")
def test_a_mirror_whose_origin_moved_is_never_deleted_automatically(tmp_path: Path) -> None:
    first = start_postgres(tmp_path / "gone" / "postgres")
    first.stop()
    mirror = first.layout.mirror
    assert mirror is not None and mirror.is_dir()
    (tmp_path / "gone").rename(tmp_path / "moved")
    second = start_postgres(tmp_path / "kept" / "postgres")
    try:
        assert (mirror / "data" / "PG_VERSION").is_file()
    finally:
        second.destroy()
        first.destroy()
    assert second.layout.mirror is not None and not second.layout.mirror.exists()


@pytest.fixture(params=["private", "reachable"])
def parent_dir(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Path]:
    """A folder to hold a state dir: pytest's own (0700, so as root Postgres needs a mirror) or a 0755 one."""
    if request.param == "private":
        yield tmp_path
        return
    path = Path(tempfile.mkdtemp(prefix="pamledger-reachable-"))
    path.chmod(0o755)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def test_moving_the_state_dir_keeps_the_ledger(parent_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(parent_dir)  # relative state dirs, as `make run` uses
    before, after = Path("checkout/.pamledger"), Path("moved/.pamledger")
    first = LocalStack.up(before)
    try:
        with psycopg.connect(first.postgres.url, autocommit=True) as conn:
            conn.execute("CREATE TABLE ledger_row (x int)")
            conn.execute("INSERT INTO ledger_row VALUES (7)")
        stop_from_file(before)
        Path("checkout").rename("moved")
        second = LocalStack.up(after)
        with psycopg.connect(second.postgres.url) as conn:
            assert conn.execute("SELECT x FROM ledger_row").fetchone() == (7,)
    finally:
        clean(after)
        clean(before)


@pytest.mark.skipif(os.geteuid() != 0, reason="root-only layout")
def test_as_root_pgdata_stays_in_a_state_dir_the_system_user_can_reach(tmp_path: Path) -> None:
    reachable = Path(tempfile.mkdtemp(prefix="pamledger-reachable-"))
    reachable.chmod(0o755)
    try:
        server = start_postgres(reachable / "postgres")
        try:
            assert server.layout.mirror is None
            assert server.data_dir == reachable / "postgres" / "data"
        finally:
            server.destroy()
        private = start_postgres(tmp_path / "postgres")
        try:
            assert private.layout.mirror is not None
            assert (tmp_path / "postgres" / "MIRROR").read_text().strip() == str(private.layout.mirror)
        finally:
            private.destroy()
    finally:
        shutil.rmtree(reachable, ignore_errors=True)


def test_a_second_nats_is_never_started_on_a_held_store(nats_server: NatsServer) -> None:
    with pytest.raises(RuntimeError, match="held by another process"):
        start_nats(nats_server.data_dir)
    assert nats_server.is_running()


def test_a_nats_restarted_by_up_is_never_forgotten_nor_doubled(state_dir: Path) -> None:
    run = LocalStack.up(state_dir)  # what `pamledger run` does first
    os.kill(run.nats.pid, signal.SIGKILL)
    assert run.nats.process is not None
    run.nats.process.wait(timeout=30)
    up = LocalStack.up(state_dir)  # `pamledger up` in another terminal
    assert up.started == {"nats"}
    run.stop_started()  # Ctrl-C on `pamledger run`
    assert up.nats.is_running()
    recorded = read_servers_file(state_dir)
    assert recorded is not None and recorded["nats_pid"] == up.nats.pid
    assert LocalStack.up(state_dir).nats.pid == up.nats.pid
    (state_dir / "servers.json").unlink()
    assert LocalStack.up(state_dir).nats.pid == up.nats.pid  # found again through the store's lock
    stop_from_file(state_dir)
    assert not up.nats.is_running()
    assert read_servers_file(state_dir) is None


def test_stack_up_records_reuses_and_stops(state_dir: Path) -> None:
    assert read_servers_file(state_dir) is None
    first = LocalStack.up(state_dir)
    assert first.started == {"nats", "postgres"}
    recorded = read_servers_file(state_dir)
    assert recorded is not None
    assert recorded["nats_url"] == first.nats.url
    assert recorded["database_url"] == first.postgres.url
    assert recorded["nats_pid"] == first.nats.pid
    assert status(state_dir).all_up

    second = LocalStack.up(state_dir)
    assert second.reused
    assert (second.nats.pid, second.postgres.pid) == (first.nats.pid, first.postgres.pid)

    stop_from_file(state_dir)
    assert read_servers_file(state_dir) is None
    assert not first.nats.is_running()
    assert not first.postgres.is_running()
    assert not status(state_dir).nats_answers


def test_stack_restarts_stale_servers_on_same_data(state_dir: Path) -> None:
    first = LocalStack.up(state_dir)
    with psycopg.connect(first.postgres.url, autocommit=True) as conn:
        conn.execute("CREATE TABLE survivor (x int)")
    first.nats.kill()
    first.postgres.stop()
    stale = status(state_dir)
    assert stale.recorded and not stale.nats_answers and not stale.postgres_answers

    second = LocalStack.up(state_dir)
    assert second.started == {"nats", "postgres"}
    assert second.nats.port == first.nats.port
    assert second.postgres.port == first.postgres.port
    with psycopg.connect(second.postgres.url) as conn:
        assert conn.execute("SELECT count(*) FROM survivor").fetchone() == (0,)
    second.stop_started()
    assert not status(state_dir).all_up


def test_only_clean_deletes_the_ledger_and_its_mirror(state_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from pamledger.cli import main

    stack = LocalStack.up(state_dir)
    pgdata, mirror = stack.postgres.data_dir, stack.postgres.layout.mirror
    stop_from_file(state_dir)
    assert (pgdata / "PG_VERSION").is_file() and (state_dir / "nats" / "jetstream").is_dir()
    monkeypatch.setenv("PAMLEDGER_STATE_DIR", str(state_dir))
    assert main(["clean"]) == 0
    assert not state_dir.exists() and not pgdata.exists()
    assert mirror is None or not mirror.exists()


def test_a_mirror_recorded_by_an_earlier_version_under_var_tmp_is_still_found(tmp_path: Path) -> None:
    """Mirrors now live under /var/lib/pamledger (systemd-tmpfiles may age /var/tmp); a state dir whose
    MIRROR file names an older /var/tmp mirror keeps using it, and anything else is refused."""
    from local_servers.pg_layout import MIRROR_FILE, MIRROR_ROOT, recorded_mirror

    (tmp_path / MIRROR_FILE).write_text("/var/tmp/pamledger-0123456789abcdef\n")
    assert recorded_mirror(tmp_path) == Path("/var/tmp/pamledger-0123456789abcdef")
    (tmp_path / MIRROR_FILE).write_text(f"{MIRROR_ROOT}/pamledger-fedcba9876543210\n")
    assert recorded_mirror(tmp_path) == MIRROR_ROOT / "pamledger-fedcba9876543210"
    (tmp_path / MIRROR_FILE).write_text("/etc/pamledger-x\n")
    with pytest.raises(RuntimeError):
        recorded_mirror(tmp_path)


def test_up_with_a_pg_replica_streams_the_primary_and_down_stops_both(state_dir: Path) -> None:
    """`up --pg-replica`: a hot standby copied from the local Postgres, recorded as database_read_urls, replaying
    what the primary commits; a second `up` reuses it; a revive after SIGKILL brings it back on its data and port;
    `down` stops it with the primary."""
    first = LocalStack.up(state_dir, pg_replica=True)
    assert first.replica is not None and first.started == {"nats", "postgres", "replica"}
    recorded = read_servers_file(state_dir)
    assert recorded is not None and recorded["database_read_urls"] == [first.replica.url]
    with psycopg.connect(first.postgres.url, autocommit=True) as conn:
        conn.execute("CREATE TABLE replicated (x int)")
        conn.execute("INSERT INTO replicated VALUES (7)")
        position = conn.execute("SELECT pg_current_wal_flush_lsn()::text").fetchone()
    with psycopg.connect(first.replica.url, autocommit=True) as conn:
        assert conn.execute("SELECT pg_is_in_recovery()").fetchone() == (True,)
        while conn.execute("SELECT pg_last_wal_replay_lsn() < %s::pg_lsn", position).fetchone() == (True,):
            pass  # replaying: a loopback standby is there within milliseconds
        assert conn.execute("SELECT x FROM replicated").fetchall() == [(7,)]
    assert LocalStack.up(state_dir, pg_replica=True).replica == first.replica  # reused, not copied again
    os.kill(first.replica.pid, signal.SIGKILL)
    deadline = time.monotonic() + 30
    while True:  # its orphaned backends may hold the shared memory a moment
        try:
            first.revive("replica")
            break
        except RuntimeError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)  # the poll interval of a retried start
    assert first.replica.is_alive() and first.replica.port == recorded["replica_port"]
    stop_from_file(state_dir)
    assert not first.replica.is_alive() and not first.postgres.is_alive()
    assert read_servers_file(state_dir) is None
