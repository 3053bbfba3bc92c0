"""Bulk-load helpers: migrate inside the load's transaction, drop and rebuild keys and indexes exactly.

`migrate_in_transaction` applies the very files `infra.migrations.migrate` applies (and records them the
same way), but inside the caller's transaction: tables created in the transaction that COPYs into them
can take `COPY ... FREEZE`, so no later scan has to rewrite every page to set hint bits.

`BulkIndexes` reads key and index definitions from the catalog (`pg_get_constraintdef`,
`pg_get_indexdef`), drops them for the load, recreates them and compares the catalog with what it read,
so the database ends up with the schema the migrations made; a duplicate key fails the rebuild loudly.
"""

from __future__ import annotations

from typing import Any

import psycopg
from psycopg import sql

from infra.migrations import migration_files

_CONSTRAINTS = ("SELECT c.conrelid::regclass::text, c.conname, pg_get_constraintdef(c.oid) FROM pg_constraint c"
                " WHERE c.conrelid = ANY(%s::regclass[]) AND c.contype IN ('p', 'u') ORDER BY 1, 2")
_INDEXES = ("SELECT i.indexrelid::regclass::text, pg_get_indexdef(i.indexrelid) FROM pg_index i"
            " WHERE i.indrelid = ANY(%s::regclass[])"
            " AND NOT EXISTS (SELECT 1 FROM pg_constraint c WHERE c.conindid = i.indexrelid) ORDER BY 1")


def migrate_in_transaction(conn: psycopg.Connection[Any]) -> list[str]:
    """Apply every infra/sql migration on an empty database inside the current transaction."""
    if conn.info.transaction_status != psycopg.pq.TransactionStatus.INTRANS:
        raise RuntimeError("migrate_in_transaction needs an open transaction")
    conn.execute("CREATE TABLE pamledger_migrations (version integer PRIMARY KEY, name text NOT NULL,"
                 " applied_at timestamptz NOT NULL DEFAULT now())")
    applied = []
    for version, name, statements in migration_files():
        conn.execute(statements)
        conn.execute("INSERT INTO pamledger_migrations (version, name) VALUES (%s, %s)", (version, name))
        applied.append(name)
    return applied


class BulkIndexes:
    """The keys and indexes of some tables, dropped for a bulk COPY and restored after it."""

    def __init__(self, conn: psycopg.Connection[Any], tables: tuple[str, ...]):
        self.conn = conn
        self.tables = list(tables)
        self.constraints: list[tuple[str, str, str]] = []
        self.indexes: list[tuple[str, str]] = []

    def _catalog(self) -> tuple[list[tuple[str, str, str]], list[tuple[str, str]]]:
        constraints = self.conn.execute(_CONSTRAINTS, (self.tables,)).fetchall()
        indexes = self.conn.execute(_INDEXES, (self.tables,)).fetchall()
        return constraints, indexes

    def drop(self) -> None:
        self.constraints, self.indexes = self._catalog()
        for name, _ in self.indexes:
            self.conn.execute(sql.SQL("DROP INDEX {}").format(sql.Identifier(name)))
        for table, name, _ in self.constraints:
            self.conn.execute(sql.SQL("ALTER TABLE {} DROP CONSTRAINT {}").format(
                sql.Identifier(table), sql.Identifier(name)))

    def restore(self) -> None:
        """Recreate keys, then indexes; raise if the catalog then differs from what was dropped."""
        self.conn.execute("SET LOCAL maintenance_work_mem = '512MB'")
        for table, name, definition in self.constraints:
            self.conn.execute(sql.SQL("ALTER TABLE {} ADD CONSTRAINT {} ").format(
                sql.Identifier(table), sql.Identifier(name)) + sql.SQL(definition))
        for _, definition in self.indexes:
            self.conn.execute(definition)
        if self._catalog() != (self.constraints, self.indexes):
            raise AssertionError(f"index rebuild changed the schema of {self.tables}")
