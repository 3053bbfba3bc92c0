"""A ledger written before [S2]'s typed events still verifies, replays and serves, and its events are the
types' bytes exactly.

The ledger is tests/fixtures/ledger_before_typed_events.json (made by tests/fixtures/make_old_ledger.py at
the commit it names, before the event types existed): 44 entries of 21 event types. Loaded as the writer
left it, it must pass `verify` (chain, versions, content, idempotency records, delegations), serve again
once the stream is rebuilt (projector, indexer and a subscription read every old event), pass
`replay --verify` against what the projector made of it, and decode into schemas.events' types that
encode back to the very bytes in the ledger.
"""

from __future__ import annotations

import asyncio
import base64
import json
from pathlib import Path
from typing import Any

import psycopg
import pytest

from command_handler.verify import verify_tables
from embedding.store import INDEX_CHECKPOINT
from infra.ledger import ledger_head
from infra.projections import PROJECTION, checkpoint
from schemas.canonical import canonical_bytes
from tests.conftest import ROLES, Env, run_cli, serving, wait_for

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "ledger_before_typed_events.json"
SCOPE = "workspace:old-ledger"
MIGRATION = Path(__file__).resolve().parents[2] / "infra" / "sql" / "017_index_catalog.sql"
CATALOG = "scope_id, object_id, version_id, sequence, ledger_sequence, object_type, content_digest"


def rows() -> dict[str, list[dict[str, Any]]]:
    tables: dict[str, list[dict[str, Any]]] = json.loads(FIXTURE.read_text())["tables"]
    return {name: [{k: base64.b64decode(v["base64"]) if isinstance(v, dict) else v for k, v in row.items()}
                   for row in found] for name, found in tables.items()}


def load(database_url: str) -> None:
    """The fixture's rows into the writer's tables of a fresh database, as they were."""
    with psycopg.connect(database_url) as conn:
        conn.execute("DELETE FROM ledger_identity")
        for table, found in rows().items():
            for row in found:
                columns = ", ".join(row)
                values = ", ".join(f"%({c})s::jsonb" if c == "policy" else f"%({c})s" for c in row)
                conflict = " ON CONFLICT DO NOTHING" if table == "scopes" else ""
                conn.execute(f"INSERT INTO {table} ({columns}) VALUES ({values}){conflict}", row)


@pytest.fixture(scope="module")
def loaded(env: Env) -> Env:
    load(env.database_url)
    return env


def test_the_old_ledger_verifies(loaded: Env) -> None:
    report = verify_tables(loaded.database_url)
    assert report["ok"], report
    assert report["head_sequence"] == len(rows()["ledger"])


async def test_the_old_ledger_serves_replays_and_verifies_again(loaded: Env) -> None:
    rebuilt = await asyncio.to_thread(run_cli, loaded, "stream", "rebuild")
    assert rebuilt.returncode == 0, rebuilt.stderr[-2000:]
    async with serving(loaded, roles=(*ROLES, "indexer")) as client:
        async with await psycopg.AsyncConnection.connect(loaded.database_url, autocommit=True) as conn:
            head = await ledger_head(conn, 0)
            await wait_for(lambda: _reached(conn, PROJECTION, head), timeout=60)
            await wait_for(lambda: _reached(conn, INDEX_CHECKPOINT, head), timeout=60)
        events = await client.events(SCOPE, after_sequence=0, limit=1000)
        assert len(events["events"]) == sum(r["scope_id"] == SCOPE for r in rows()["ledger"])
        subscription = await client.subscribe(SCOPE, {"actor_id": "actor:agent:old", "actor_kind": "agent"},
                                              after_sequence=0)
        seen = []
        async for event in subscription:
            seen.append(event["ledger_sequence"])
            if len(seen) == len(events["events"]):
                break
        await subscription.close()
        assert seen == [e["ledger_sequence"] for e in events["events"]]
        await _the_migration_seeds_the_catalog_the_indexer_built(loaded.database_url)
    replayed = await asyncio.to_thread(run_cli, loaded, "replay", "--verify")
    assert replayed.returncode == 0, replayed.stdout[-2000:] + replayed.stderr[-2000:]
    verified = await asyncio.to_thread(run_cli, loaded, "verify")
    assert verified.returncode == 0 and json.loads(verified.stdout)["ok"], verified.stdout[-2000:]


async def _the_migration_seeds_the_catalog_the_indexer_built(database_url: str) -> None:
    """infra/sql/017 gives an existing ledger the indexer's catalog from the version store; on this ledger
    it must be the very catalog the indexer's follower built event by event."""
    seed = MIGRATION.read_text()
    seed = seed[seed.index("INSERT INTO index_catalog"):]
    async with await psycopg.AsyncConnection.connect(database_url) as conn:
        built = await (await conn.execute(f"SELECT {CATALOG} FROM index_catalog ORDER BY 1, 2")).fetchall()
        await conn.execute("DELETE FROM index_catalog")
        await conn.execute(seed)
        seeded = await (await conn.execute(f"SELECT {CATALOG} FROM index_catalog ORDER BY 1, 2")).fetchall()
        await conn.rollback()  # the follower's catalog stays
    assert len(built) >= 5 and seeded == built


async def _reached(conn: psycopg.AsyncConnection[Any], name: str, head: int) -> bool:
    return await checkpoint(conn, name) >= head


def test_the_fixture_holds_every_kind_of_entry_but_denials() -> None:
    types = {json.loads(r["event"])["event_type"] for r in rows()["ledger"]}
    assert len(types) == 21 and "access_denied" not in types, sorted(types)
    assert canonical_bytes(json.loads(rows()["ledger"][0]["event"])) == rows()["ledger"][0]["event"]
