"""The LedgerStore contract (tests/ledger_store_contract.py) on PostgresLedgerStore, through each of its two
append paths (one statement; COPYs in a transaction), and both stores fed the same batches keep the same rows.

Each test gets a database of its own, cloned from the migrated template (the contract starts from an empty
store every time), dropped after it."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any, ClassVar

import psycopg
import pytest

from command_handler.memory_store import InMemoryLedgerStore
from command_handler.store import PostgresLedgerStore
from schemas.canonical import decode_json
from tests.conftest import Servers, fresh_database
from tests.integration.test_append_paths import TABLES, planned_batches
from tests.ledger_store_contract import LedgerStoreContract

PATHS = {"one_statement": 10**6, "copy": 0}  # single_statement_rows: every batch one way or the other


@pytest.fixture(params=sorted(PATHS))
async def postgres_store(servers: Servers, request: pytest.FixtureRequest) -> AsyncIterator[PostgresLedgerStore]:
    url = fresh_database(servers, f"store_{request.param}")
    try:
        async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
            yield PostgresLedgerStore(conn, single_statement_rows=PATHS[request.param])
    finally:
        async with await psycopg.AsyncConnection.connect(servers.admin_url, autocommit=True) as admin:
            await admin.execute(f"DROP DATABASE IF EXISTS {url.rsplit('/', 1)[1]} WITH (FORCE)")


class TestPostgresLedgerStore(LedgerStoreContract):
    refusals: ClassVar[tuple[type[BaseException], ...]] = (psycopg.Error,)

    @staticmethod
    def constraint(exc: BaseException) -> str | None:
        return exc.diag.constraint_name if isinstance(exc, psycopg.Error) else None

    @pytest.fixture
    def store(self, postgres_store: PostgresLedgerStore) -> PostgresLedgerStore:
        return postgres_store


def memory_tables(store: InMemoryLedgerStore) -> dict[str, list[tuple[Any, ...]]]:
    """The in-memory store's rows as `SELECT {TABLES[table]} FROM table` gives Postgres's."""
    return {
        "ledger": [(store.partition, r.ledger_sequence, r.event_id, r.operation_id, r.scope_id, r.object_id,
                    r.version_id, r.event_type, r.recorded_at, r.event, r.prev_hash, r.row_hash)
                   for r in store.ledger.values()],
        "memory_versions": [(v.scope_id, v.object_id, v.sequence, v.version_id, v.ledger_sequence, v.meta,
                             v.content_digest) for v in store.versions.values()],
        "content_store": [(c.content_digest, c.scope_id, c.object_id, c.salt, c.content)
                          for c in store.content.values()],
        "idempotency_records": [(r.scope_id, r.idempotency_key, r.request_digest, r.object_id, r.version_id,
                                 r.ledger_sequence) for r in store.idempotency.values()],
        "scopes": [(s.scope_id, s.scope_kind, s.parent_scope_id, None if s.policy is None else decode_json(s.policy))
                   for s in store.scopes.values()],
    }


async def test_both_stores_fed_the_same_batches_keep_the_same_rows(postgres_store: PostgresLedgerStore) -> None:
    """Column for column, not only through the reads: salts, scope kinds, forgotten digests, erased rows."""
    batches = planned_batches()
    memory = InMemoryLedgerStore()
    for batch in batches:
        await postgres_store.append(batch)
        await memory.append(batch)
    kept = {}
    for table, columns in TABLES.items():
        cur = await postgres_store.conn.execute(f"SELECT {columns} FROM {table}")
        kept[table] = sorted(map(tuple, await cur.fetchall()), key=repr)
    assert kept == {table: sorted(rows, key=repr) for table, rows in memory_tables(memory).items()}
