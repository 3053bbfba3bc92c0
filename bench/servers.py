"""Where the benchmark's NATS and Postgres come from: private servers on free loopback ports, or env URLs.

Private servers live under one temp dir and are always torn down (Postgres data and its mirror
included), even when a scenario fails or the run is interrupted. With PAMLEDGER_NATS_URL and
PAMLEDGER_DATABASE_URL both set, those servers are used instead; the database URL must be allowed to
CREATE DATABASE, because every scenario gets a fresh database of its own, dropped when it ends.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import tempfile
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from infra.migrations import migrate


@dataclass
class Servers:
    """A NATS URL, an admin Postgres URL, and a scratch dir for logs."""

    nats_url: str
    admin_url: str
    work_dir: Path
    private: bool
    created: list[str] = field(default_factory=list)
    server_pids: dict[str, int] = field(default_factory=dict)  # private servers only: name -> pid

    def database_url(self, name: str) -> str:
        return make_conninfo(self.admin_url, dbname=name)

    def pg_params(self, name: str) -> dict[str, Any]:
        """host/port/user/password/dbname of one database (for libraries that want them apart)."""
        params = conninfo_to_dict(self.database_url(name))
        return {"host": params.get("host", "127.0.0.1"), "port": str(params.get("port", 5432)),
                "user": params.get("user", "postgres"), "password": params.get("password", ""),
                "dbname": name}

    def fresh_database(self, label: str, migrated: bool = True) -> tuple[str, str]:
        """Create an empty database (migrated to the pamledger schema unless told otherwise): (name, url)."""
        name = f"bench_{label}_{uuid.uuid4().hex[:8]}"
        with psycopg.connect(self.admin_url, autocommit=True) as conn:
            conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
        self.created.append(name)
        url = self.database_url(name)
        if migrated:
            migrate(url)
        return name, url

    def drop_database(self, name: str) -> None:
        with contextlib.suppress(psycopg.Error), psycopg.connect(self.admin_url, autocommit=True) as conn:
            conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))
        if name in self.created:
            self.created.remove(name)


@contextlib.contextmanager
def bench_servers() -> Iterator[Servers]:
    """Yield servers for one benchmark run; stop (or clean up on) them whatever happens."""
    nats_url = os.environ.get("PAMLEDGER_NATS_URL")
    admin_url = os.environ.get("PAMLEDGER_DATABASE_URL")
    root = Path(tempfile.mkdtemp(prefix="pamledger-bench-"))
    handles: list[Any] = []
    try:
        if nats_url and admin_url:
            found = Servers(nats_url, admin_url, root, private=False)
        else:
            from local_servers.launch import start_nats, start_postgres

            handles.append(start_nats(root / "nats"))
            handles.append(start_postgres(root / "postgres"))
            found = Servers(handles[0].url, handles[1].url, root, private=True,
                            server_pids={"nats-server": handles[0].pid, "postgres": handles[1].pid})
        try:
            yield found
        finally:
            for name in list(found.created):
                found.drop_database(name)
    finally:
        for sig in (signal.SIGINT, signal.SIGTERM):  # a second Ctrl-C must not leave servers behind
            signal.signal(sig, signal.SIG_IGN)
        for handle in reversed(handles):
            with contextlib.suppress(Exception):
                handle.stop()
            if hasattr(handle, "layout"):  # Postgres: also remove its data and any mirror
                from local_servers.postgres_server import remove_postgres_data

                remove_postgres_data(handle.layout)
        shutil.rmtree(root, ignore_errors=True)
