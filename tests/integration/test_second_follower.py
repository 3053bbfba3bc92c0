"""A second follower of the ledger stream (a test apply step writing a scratch table) runs beside the
projector on the kernel follower: it sees every event once, keeps its own checkpoint and notify channel,
and after a restart resumes from its checkpoint (nothing missed, nothing applied twice).

Why: the indexer and the grants projection are the next followers; adding one must be an apply step and
a spec, with nothing of the projector's welded in (its consumer name, checkpoint row, channel or lock).
"""

from __future__ import annotations

import asyncio
from typing import Any

import psycopg
import pytest

from infra.follower import Event, FollowerSpec
from infra.projections import PROJECTION, checkpoint
from pamledger_client.protocol.tasks import stop_task
from pamledger_client.client import MemoryClient
from pamledger.runtime import connect_nats, follow_forever
from query.search import CheckpointWatcher
from tests.conftest import ACTOR, PROVENANCE, Env, wait_for

SCOPE = "workspace:second-follower"
SCRATCH = "scratch_follower"


class ScratchStep:
    """Records each event's ledger sequence and size: no key, so an event applied twice would show."""

    async def apply(self, conn: psycopg.AsyncConnection[Any], events: list[Event]) -> None:
        for sequence, event in events:
            await conn.execute(f"INSERT INTO {SCRATCH} (ledger_sequence, size) VALUES (%s, %s)",
                               (sequence, len(event)))


SPEC = FollowerSpec(name="scratch", checkpoint=SCRATCH, notify_channel="pamledger_scratch",
                    lock_base=0x7363_7274_00, step=ScratchStep)


@pytest.fixture(scope="module", autouse=True)
async def scratch_table(service: Env) -> None:
    async with await psycopg.AsyncConnection.connect(service.database_url, autocommit=True) as conn:
        await conn.execute(f"CREATE TABLE {SCRATCH} (ledger_sequence bigint NOT NULL, size int NOT NULL)")


async def start_scratch(env: Env) -> tuple[asyncio.Task[None], Any]:
    nc = await connect_nats(env.nats_url, "pamledger-scratch-test")
    return asyncio.create_task(follow_forever(env.settings, nc, env.database_url, SPEC)), nc


async def stop_scratch(task: asyncio.Task[None], nc: Any) -> None:
    await stop_task(task)
    await nc.close()


async def state(env: Env) -> tuple[int, int, list[int]]:
    """(projector checkpoint, scratch checkpoint, the sequences the scratch table holds, in order)."""
    async with await psycopg.AsyncConnection.connect(env.database_url, autocommit=True) as conn:
        seen = await (await conn.execute(f"SELECT ledger_sequence FROM {SCRATCH} ORDER BY 1")).fetchall()
        return await checkpoint(conn, PROJECTION), await checkpoint(conn, SCRATCH), [row[0] for row in seen]


async def notes(client: MemoryClient, count: int, label: str) -> int:
    last = 0
    for i in range(count):
        last = (await client.create(SCOPE, "com.example.note", {"body": f"{label} {i}"}, ACTOR, PROVENANCE,
                                    schema_id="https://example.com/note.json"))["ledger_sequence"]
    return last


async def test_a_second_follower_follows_beside_the_projector_and_resumes_from_its_own_checkpoint(
        service: Env, client: MemoryClient) -> None:
    await client.create_scope(SCOPE)
    head = await notes(client, 5, "before")
    task, nc = await start_scratch(service)
    watcher = CheckpointWatcher(SCRATCH, SPEC.notify_channel)
    watching = asyncio.create_task(watcher.run(service.database_url))
    try:
        # It starts from nothing and catches up with the whole ledger, beside the projector.
        assert await watcher.wait_for(head, timeout=60), "the scratch follower's commits notify its own channel"
        assert await wait_for(lambda: _reached(service, head, head), timeout=60)
        assert (await state(service))[2] == list(range(1, head + 1))
        assert (await client.status("scratch"))["stuck"] is None
        await stop_scratch(task, nc)

        # Stopped, it stands still while the projector moves on.
        stopped_at = head
        head = await notes(client, 4, "while stopped")
        assert (await client.query(SCOPE, min_sequence=head, wait_ms=10_000))["min_sequence_reached"]
        projected, scratch, _ = await state(service)
        assert (projected, scratch) == (head, stopped_at)

        # Restarted, it resumes after its checkpoint: every event exactly once, none missed.
        task, nc = await start_scratch(service)
        assert await watcher.wait_for(head, timeout=60)
        head = await notes(client, 3, "after the restart")
        assert await wait_for(lambda: _reached(service, head, head), timeout=60)
        assert (await state(service))[2] == list(range(1, head + 1))
    finally:
        await stop_task(watching)
        if not task.done():
            await stop_scratch(task, nc)


async def _reached(env: Env, projected: int, scratch: int) -> bool:
    found = await state(env)
    return found[0] >= projected and found[1] >= scratch
