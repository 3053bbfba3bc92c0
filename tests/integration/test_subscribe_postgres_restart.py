"""Subscribe comes back by itself after Postgres is SIGKILLed and restarted on the same port.

Why: the gateway only touched its database session when positions moved, so after a Postgres restart
every `sub.open` answered service_unavailable until the gateway process was killed (80 s and more). Now
it notices a lost session within seconds, takes its lock again on a new one, and its open subscriptions
go on from their in-memory positions: delivery resumes exactly once. The query service's pool must not
hand out a dead connection either.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

from infra.migrations import migrate
from pamledger_client.client import MemoryClient, PamspecError
from tests.conftest import ACTOR, PROVENANCE, Env, Servers, fresh_settings, wait_for

SCOPE = "workspace:pg-restart"
RECOVERY_SECONDS = 30.0  # generous: a loaded 2-core box; the gateway itself needs a few seconds


class PrivatePostgres:
    """A Postgres of this module's own, so killing it disturbs no other module."""

    def __init__(self, data_dir: Path):
        from local_servers.launch import start_postgres

        self.data_dir = data_dir
        self.server = start_postgres(data_dir)

    def kill(self) -> None:
        """SIGKILL the postmaster and every process it started (backends included), and wait until they
        are gone: the whole cluster dies at once, as in a machine's OOM kill."""
        pids = [self.server.pid, *children(self.server.pid)]
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        deadline = time.monotonic() + 30
        while any(Path(f"/proc/{pid}").exists() and not _zombie(pid) for pid in pids):
            assert time.monotonic() < deadline, "the killed cluster's processes did not exit"
            time.sleep(0.05)

    def restart(self) -> None:
        """Start it again on the same port and data; retries while the killed one's backends still exit."""
        from local_servers.launch import start_postgres

        # Until the killed postmaster is reaped (this machine's init reaps orphans late) its zombie's pid
        # still looks alive in postmaster.pid, and Postgres refuses to start: try again until it is gone.
        deadline = time.monotonic() + 60
        while True:
            try:
                self.server = start_postgres(self.data_dir, port=self.server.port)
                return
            except RuntimeError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.2)


def children(parent: int) -> list[int]:
    """Pids whose parent is `parent` (from /proc)."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1]) == parent:
                    found.append(int(entry.name))
            except (OSError, IndexError, ValueError):
                continue
    return found


def _zombie(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except (OSError, IndexError):
        return True


@pytest.fixture(scope="module")
def postgres(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PrivatePostgres]:
    private = PrivatePostgres(tmp_path_factory.mktemp("pg-restart") / "postgres")
    yield private
    getattr(private.server, "destroy", private.server.stop)()


@pytest.fixture(scope="module")
def env(servers: Servers, postgres: PrivatePostgres) -> Env:
    """Overrides conftest's: the module's database lives on its private Postgres."""
    name = f"t_pgrestart_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(postgres.server.url, autocommit=True) as conn:
        conn.execute(f"CREATE DATABASE {name}")
    private = Servers(servers.nats_url, postgres.server.url)
    migrate(private.database_url(name))
    return Env(private, private.database_url(name), fresh_settings("pgrestart"))


@pytest.fixture(scope="module", autouse=True)
async def scope(client: MemoryClient) -> None:
    await client.create_scope(SCOPE)


async def make(client: MemoryClient, label: str) -> dict[str, Any]:
    return await client.create(SCOPE, "claim", {"label": label}, ACTOR, PROVENANCE,
                               idempotency_key=f"pgr:{label}")  # a retried write is the same write


async def answers(call: Any) -> Any:
    """The call's result, or None while it fails (the service is still coming back)."""
    try:
        return await call()
    except PamspecError:
        return None


async def stored_position(env: Env, subscription_id: str) -> int:
    """The acknowledged position the gateway last wrote for a subscription (-1 before any)."""
    async with await psycopg.AsyncConnection.connect(env.database_url) as conn:
        cur = await conn.execute("SELECT acked_sequence FROM subscriptions WHERE subscription_id = %s",
                                 (subscription_id,))
        row = await cur.fetchone()
    return -1 if row is None or row[0] is None else int(row[0])


async def test_open_poll_and_delivery_resume_after_a_postgres_restart(client: MemoryClient, env: Env,
                                                                      postgres: PrivatePostgres) -> None:
    before = await make(client, "before")
    start = before["ledger_sequence"] - 1
    pushed = await client.subscribe(SCOPE, ACTOR, after_sequence=start, filter={"event_classes": ["object_created"]})
    polled = (await client.subscription_request("open", {
        "scope_id": SCOPE, "actor": ACTOR, "after_sequence": start, "filter": {"event_classes": ["object_created"]},
        "delivery": {"mode": "poll"}}))["subscription_id"]
    received: list[dict[str, Any]] = []

    async def read() -> None:
        async for event in pushed:
            received.append(event)

    reader = asyncio.create_task(read())
    try:
        await wait_for(lambda: len(received) == 1, timeout=60)
        first = await client.subscription_request("poll", {"subscription_id": polled, "wait_ms": 5000})
        assert [e["event"]["object_id"] for e in first["events"]] == [before["object_id"]]
        for subscription_id in (pushed.subscription_id, polled):  # positions reach Postgres before it dies
            await wait_for(lambda: _at(env, subscription_id, before["ledger_sequence"]), timeout=60, interval=0.1)

        postgres.kill()
        await asyncio.to_thread(postgres.restart)
        restarted = asyncio.get_running_loop().time()

        # Open first, before anything moves a position (the old gateway noticed only when one moved).
        client.retries = 0
        opened = await wait_for(lambda: answers(lambda: client.subscription_request("open", {
            "scope_id": SCOPE, "actor": ACTOR, "delivery": {"mode": "poll"}})), timeout=RECOVERY_SECONDS)
        assert opened["subscription_id"]
        assert asyncio.get_running_loop().time() - restarted < RECOVERY_SECONDS
        after = await wait_for(lambda: answers(lambda: make(client, "after")), timeout=RECOVERY_SECONDS)

        got = await client.subscription_request("poll", {"subscription_id": polled, "wait_ms": 10000})
        assert [e["event"]["object_id"] for e in got["events"]] == [after["object_id"]]
        await wait_for(lambda: len(received) >= 2, timeout=RECOVERY_SECONDS)
        later = await make(client, "later")
        # Delivery is in ledger order: a duplicate of anything before it would arrive before this last one.
        last = await make(client, "last")
        await wait_for(lambda: any(e["event"]["object_id"] == last["object_id"] for e in received),
                       timeout=RECOVERY_SECONDS)
        assert [e["event"]["object_id"] for e in received] == \
            [before["object_id"], after["object_id"], later["object_id"], last["object_id"]], \
            "each event once, in order"

        # The query service's pool replaced its dead connections: reads answer at the first attempt.
        for _ in range(4):
            read_back = await client.read(SCOPE, later["object_id"])
            assert read_back["canonical_content"] == {"label": "later"}
        # ... and queries see the projection move again (its checkpoint watcher reconnected too).
        assert (await client.query(SCOPE, min_sequence=later["ledger_sequence"]))["as_of_sequence"] >= \
            later["ledger_sequence"]
    finally:
        reader.cancel()
        client.retries = 5
        await pushed.close()


async def _at(env: Env, subscription_id: str, sequence: int) -> bool:
    return await stored_position(env, subscription_id) >= sequence


async def test_a_close_while_postgres_is_down_stops_delivery_answers_retryable_and_a_retry_completes_it(
        client: MemoryClient, postgres: PrivatePostgres, env: Env) -> None:
    """A close is acknowledged only once it is durable: answered 'done' while held only in memory, a
    gateway death before the database came back let the next leader deliver to a client told 'closed'."""
    head = (await make(client, "before close"))["ledger_sequence"]
    subscription_id = (await client.subscription_request("open", {
        "scope_id": SCOPE, "actor": ACTOR, "after_sequence": head, "delivery": {"mode": "poll"}}))["subscription_id"]
    postgres.kill()
    client.retries = 0
    try:
        with pytest.raises(PamspecError) as err:
            await client.subscription_request("close", {"subscription_id": subscription_id})
        assert err.value.code == "service_unavailable" and err.value.retryable
        polled = await client.subscription_request("poll", {"subscription_id": subscription_id, "wait_ms": 100})
        assert polled["events"] == [] and polled["closed"] is True  # delivery stopped all the same
    finally:
        await asyncio.to_thread(postgres.restart)
    closed = await wait_for(lambda: answers(lambda: client.subscription_request(
        "close", {"subscription_id": subscription_id})), timeout=RECOVERY_SECONDS, interval=0.2)
    client.retries = 5
    assert closed["subscription_id"] == subscription_id and closed["reason"] == "unsubscribed"

    async def recorded() -> bool:
        async with await psycopg.AsyncConnection.connect(env.database_url) as conn:
            cur = await conn.execute("SELECT status FROM subscriptions WHERE subscription_id = %s",
                                     (subscription_id,))
            status = await cur.fetchone()
            cur = await conn.execute("SELECT count(*) FROM ledger WHERE event_type = 'subscription_closed'"
                                     " AND convert_from(event, 'UTF8') LIKE %s", (f"%{subscription_id}%",))
            entries = await cur.fetchone()
        return status == ("closed",) and entries == (1,)

    await wait_for(recorded, timeout=RECOVERY_SECONDS, interval=0.2)
