"""The query role on a streaming read replica (`database.read_urls`): a private primary and a replica of it
(pg_basebackup, as `pamledger up --pg-replica` starts it), the service in this event loop.

Read-your-writes and erasure hold on the replica because each scan waits for the replica to replay the
primary's position first (query.replica_fence); with replay paused that fence is what sends the query to
the primary. SIGKILL of the replica: queries go on from the primary, and return to the replica once it is back.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

from infra.settings import DatabaseSettings
from local_servers.postgres_server import PostgresServer, launch_replica
from tests.conftest import ACTOR, PROVENANCE, Env, Servers, fresh_settings, in_database, primary_and_replica, \
    serving, wait_for

DATABASE = "pamledger_replica_test"


@pytest.fixture(scope="module")
def pair(servers: Servers, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """A primary of this module's own (the session's serves every module) and a streaming replica of it."""
    with primary_and_replica(tmp_path_factory.mktemp("replica"), DATABASE) as handles:
        yield handles


def _in_database(url: str) -> str:
    return in_database(url, DATABASE)


@pytest.fixture(scope="module")
def replica_env(servers: Servers, pair: dict[str, Any]) -> Env:
    primary: PostgresServer = pair["primary"]
    replica: PostgresServer = pair["replica"]
    # A generous wait, so a replica slowed by a busy machine still answers the first test's queries; the paused
    # replica of the second costs it once.
    database = DatabaseSettings(read_urls=[_in_database(replica.url)], replica_wait_ms=2000,
                                replica_retry_seconds=0.2)
    return Env(Servers(servers.nats_url, primary.url), _in_database(primary.url),
               fresh_settings("replica", database=database))


@pytest.fixture(scope="module")
async def client(replica_env: Env) -> AsyncIterator[Any]:
    async with serving(replica_env) as found:
        await found.create_scope("scope:replica:probe")
        await wait_for(lambda: _reads(found, "replica"), timeout=30)  # the prober found the replica serving
        yield found


async def _database_status(client: Any) -> dict[str, Any]:
    status = await client.status("query")
    found: dict[str, Any] = status["database"]
    return found


async def _reads(client: Any, source: str) -> bool:
    """A query was answered and the query role says it read `source`."""
    await client.query("scope:replica:probe")
    return bool((await _database_status(client))["reads_from"] == source)


def _replica_sql(pair: dict[str, Any], statement: str) -> Any:
    with psycopg.connect(_in_database(pair["replica"].url), autocommit=True) as conn:
        return conn.execute(statement).fetchone()


async def _query(client: Any, scope: str, min_sequence: int) -> dict[str, Any]:
    """Every object of the scope (a create is `unverified`), once the projection holds min_sequence."""
    found: dict[str, Any] = await client.query(scope, min_sequence=min_sequence, wait_ms=5000,
                                               validation_states=["unverified"])
    return found


async def _write(client: Any, scope: str, text: str) -> dict[str, Any]:
    created: dict[str, Any] = await client.create(scope, "claim", {"text": text}, ACTOR, PROVENANCE)
    return created


async def test_a_query_on_the_replica_sees_the_write_it_follows(client: Any) -> None:
    """Read-your-writes: a create acknowledged, then a query with min_sequence = its sequence, answered by the
    replica, holds the object."""
    await client.create_scope("scope:replica:a")
    before = await _database_status(client)
    for n in range(20):
        created = await _write(client, "scope:replica:a", f"fact {n}")
        found = await _query(client, "scope:replica:a", created["ledger_sequence"])
        assert found["min_sequence_reached"] is True
        assert created["object_id"] in {item["envelope"]["object_id"] for item in found["items"]}
    after = await _database_status(client)
    assert after["reads_from"] == "replica"
    assert after["replicas"][0]["reads"] >= before["replicas"][0]["reads"] + 20
    assert after["primary_reads"] == before["primary_reads"]


async def test_a_replica_that_has_not_replayed_the_write_is_passed_over(client: Any, pair: dict[str, Any]) -> None:
    """Replay paused: the replica lacks the create and the erasure just acknowledged, so the fence sends the
    query to the primary, which has both; once replay resumes the replica serves again."""
    await client.create_scope("scope:replica:b")
    kept = await _write(client, "scope:replica:b", "kept words")
    erased = await _write(client, "scope:replica:b", "erased words")
    await wait_for(lambda: _reads(client, "replica"))
    _replica_sql(pair, "SELECT pg_wal_replay_pause()")
    try:
        created = await _write(client, "scope:replica:b", "fresh words")
        gone = await client.delete("scope:replica:b", erased["object_id"], erased["version_id"], ACTOR, PROVENANCE)
        found = await _query(client, "scope:replica:b", gone["ledger_sequence"])
        items = {item["envelope"]["object_id"]: item["envelope"] for item in found["items"]}
        assert found["min_sequence_reached"] is True
        assert created["object_id"] in items and kept["object_id"] in items
        assert items.get(erased["object_id"], {}).get("canonical_content") is None
        state = await _database_status(client)
        assert state["reads_from"] == "primary"
        assert state["replicas"][0]["state"] == "behind" and state["replicas"][0]["lag_bytes"] > 0
    finally:
        _replica_sql(pair, "SELECT pg_wal_replay_resume()")
    await wait_for(lambda: _reads(client, "replica"), timeout=10)
    again = await _query(client, "scope:replica:b", gone["ledger_sequence"])  # now from the replica
    assert (await _database_status(client))["reads_from"] == "replica"
    assert {item["envelope"]["object_id"]: item["envelope"] for item in again["items"]} == items


async def test_queries_go_on_from_the_primary_while_the_replica_is_killed(client: Any, pair: dict[str, Any]) -> None:
    """SIGKILL of the replica's postmaster: every query still answers (from the primary, status says so); the
    replica started again on its data, queries return to it."""
    await client.create_scope("scope:replica:c")
    await wait_for(lambda: _reads(client, "replica"))
    replica: PostgresServer = pair["replica"]
    os.kill(replica.pid, signal.SIGKILL)
    for n in range(10):
        created = await _write(client, "scope:replica:c", f"while away {n}")
        found = await _query(client, "scope:replica:c", created["ledger_sequence"])
        assert created["object_id"] in {item["envelope"]["object_id"] for item in found["items"]}
    state = await _database_status(client)
    assert state["reads_from"] == "primary"
    assert state["replicas"][0]["state"] == "away"
    pair["replica"] = _restart(pair["primary"], pair["root"] / "replica", replica.port)
    await wait_for(lambda: _reads(client, "replica"), timeout=30)
    created = await _write(client, "scope:replica:c", "back")
    found = await _query(client, "scope:replica:c", created["ledger_sequence"])
    assert created["object_id"] in {item["envelope"]["object_id"] for item in found["items"]}
    assert (await _database_status(client))["reads_from"] == "replica"


def _restart(primary: PostgresServer, data_dir: Path, port: int, timeout: float = 30.0) -> PostgresServer:
    """Start the killed replica again on its data and port; its orphaned backends may hold the shared memory
    for a moment, so a refused start is tried again until `timeout`."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            return launch_replica(primary.port, data_dir, port)
        except (RuntimeError, TimeoutError):
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)  # the poll interval of a retried start
