"""Apply the numbered SQL files in infra/sql once each, under an advisory lock so migrators don't race."""

from __future__ import annotations

from importlib import resources
from typing import Any

import psycopg
import structlog

from infra import locks

log = structlog.get_logger(__name__)


def migration_files() -> list[tuple[int, str, str]]:
    """(version, name, sql) for every infra/sql/NNN_*.sql, in order."""
    found = []
    for entry in resources.files("infra").joinpath("sql").iterdir():
        if entry.name.endswith(".sql"):
            found.append((int(entry.name.split("_", 1)[0]), entry.name, entry.read_text()))
    return sorted(found)


def migrate(database_url: str) -> list[str]:
    """Bring the database up to date; returns the names of the files applied now."""
    applied: list[str] = []
    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute("SELECT pg_advisory_lock(%s)", (locks.MIGRATION,))
        try:
            conn.execute(
                "CREATE TABLE IF NOT EXISTS pamledger_migrations ("
                " version integer PRIMARY KEY, name text NOT NULL, applied_at timestamptz NOT NULL DEFAULT now())"
            )
            done = {row[0] for row in conn.execute("SELECT version FROM pamledger_migrations")}
            for version, name, sql in migration_files():
                if version in done:
                    continue
                with conn.transaction():
                    conn.execute(sql)  # type: ignore[call-overload,unused-ignore]
                    conn.execute("INSERT INTO pamledger_migrations (version, name) VALUES (%s, %s)", (version, name))
                log.info("migration.applied", name=name)
                applied.append(name)
        finally:
            conn.execute("SELECT pg_advisory_unlock(%s)", (locks.MIGRATION,))
    return applied


async def schema_version(conn: psycopg.AsyncConnection[Any]) -> int:
    """The newest migration applied to the database (0: none)."""
    row = await (await conn.execute("SELECT coalesce(max(version), 0) FROM pamledger_migrations")).fetchone()
    return int(row[0]) if row else 0
