"""The indexer stops and comes back: it resumes from its checkpoint, writes no vector twice, and every
`embedding_generated` entry reaches the ledger exactly once, also when the indexer process is SIGKILLed while
its outbox still holds entries.

Why real processes for the kill: the outbox's promise is about the window between the writer's append and
the outbox row's deletion, which only a real kill opens at an arbitrary point.
"""

from __future__ import annotations

import signal
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import msgspec
import psycopg

from embedding.store import INDEX_CHECKPOINT, list_spaces
from indexer.outbox import Entry, add_entries, send_some
from infra.projections import checkpoint
from infra.requester import CommandRequester
from pamledger.supervisor import ROLES as ALL_ROLES
from tests.conftest import ACTOR, PROVENANCE, ROLES, Env, service_environment, serving, wait_for
from tests.integration.test_indexer import indexed_through

SCOPE = "workspace:restarted"
ROOT = Path(__file__).resolve().parents[2]


async def listed(env: Env) -> Counter[tuple[str, str, str]]:
    """(space, object, version) → how many embedding_generated entries list it."""
    async with await psycopg.AsyncConnection.connect(env.database_url, autocommit=True) as conn:
        cur = await conn.execute("SELECT event FROM ledger WHERE event_type = 'embedding_generated'")
        payloads = [msgspec.json.decode(bytes(r[0]))["payload"] for r in await cur.fetchall()]
    return Counter((p["embedding_space_id"], o, v) for p in payloads for o, v in p["items"])


async def vector_versions(env: Env) -> dict[str, str]:
    async with await psycopg.AsyncConnection.connect(env.database_url, autocommit=True) as conn:
        spaces = await list_spaces(conn)
        assert len(spaces) == 1
        cur = await conn.execute(f"SELECT object_id, version_id FROM embedding_vectors_{spaces[0].space_key}")
        return dict(await cur.fetchall())


async def create_many(client: Any, n: int, label: str) -> list[dict[str, Any]]:
    return [await client.create(SCOPE, "claim", {"statement": f"{label} {i}"}, ACTOR, PROVENANCE) for i in range(n)]


async def test_a_stopped_indexer_resumes_from_its_checkpoint_without_duplicates(env: Env) -> None:
    async with serving(env, ALL_ROLES, roles=ALL_ROLES) as client:
        await client.create_scope(SCOPE)
        await wait_for(lambda: indexed_through(env, 0), timeout=30)  # the default space is there: live embedding
        first = await create_many(client, 5, "before")
        await wait_for(lambda: indexed_through(env, first[-1]["ledger_sequence"]), timeout=30)
    async with serving(env, ROLES, roles=ROLES) as client:  # no indexer: the ledger moves on without it
        second = await create_many(client, 5, "while away")
    stopped_at = await _checkpoint(env)
    assert stopped_at < second[-1]["ledger_sequence"]
    made = first + second

    async def all_listed() -> Counter[tuple[str, str, str]] | None:
        counts = await listed(env)
        return counts if len(counts) >= len(made) else None
    async with serving(env, ALL_ROLES, roles=ALL_ROLES):
        await wait_for(lambda: indexed_through(env, second[-1]["ledger_sequence"]), timeout=30)
        # the outbox sends its entries after the checkpoint moved: wait for them while the indexer still runs
        counts = await wait_for(all_listed, timeout=60)
    assert await vector_versions(env) == {m["object_id"]: m["version_id"] for m in made}
    assert sorted(counts.values()) == [1] * len(made)


async def _checkpoint(env: Env) -> int:
    async with await psycopg.AsyncConnection.connect(env.database_url, autocommit=True) as conn:
        return await checkpoint(conn, INDEX_CHECKPOINT)


async def test_an_entry_sent_again_after_a_crash_is_a_replay_not_a_second_entry(env: Env) -> None:
    """The crash window: the writer appended the entry but the outbox row's deletion never committed."""
    entry = Entry(SCOPE, "embedding_generated", "emb:test:crash-window", {
        "embedding_space_id": "space:x:v1", "space_digest": "sha256:00", "count": 0, "items": [],
        "from_ledger_sequence": 1, "through_ledger_sequence": 1})
    async with serving(env, ROLES, roles=ROLES) as client:
        requester = CommandRequester(client.nc, env.settings.subject_prefix)
        async with await psycopg.AsyncConnection.connect(env.database_url, autocommit=True) as conn:
            for _ in range(2):
                await add_entries(conn, [entry])
                assert await send_some(conn, requester, 10) >= 1
            assert await (await conn.execute("SELECT count(*) FROM index_outbox")).fetchone() == (0,)
            keyed = await conn.execute("SELECT count(*) FROM idempotency_records WHERE idempotency_key = %s",
                                       (entry.idempotency_key,))
            assert await keyed.fetchone() == (1,)


class IndexerProcess:
    """`python -m pamledger serve --roles indexer` against the module's servers: a kill is a real kill. Its
    sender takes the whole outbox in one pass (one transaction), so a kill after the first send and before
    that pass commits leaves rows whose entries the ledger already holds: the crash window."""

    def __init__(self, env: Env, log: Path):
        self.log = open(log, "ab")
        environment = service_environment(env, PAMLEDGER_INDEXER__OUTBOX_BATCH="10000",
                                          PAMLEDGER_INDEXER__OUTBOX_RETRY_MAX_SECONDS="0.1",
                                          PAMLEDGER_INDEXER__OUTBOX_POLL_SECONDS="0.05")
        self.proc = subprocess.Popen([sys.executable, "-m", "pamledger", "serve", "--roles", "indexer"], cwd=ROOT,
                                     env=environment, stdout=self.log, stderr=self.log)

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait()
        self.log.close()


async def test_entries_reach_the_ledger_once_when_the_indexer_is_killed_while_sending(
        env: Env, tmp_path: Path) -> None:
    scopes = [f"workspace:killed-{i}" for i in range(150)]  # one entry per scope and batch: many entries
    async with serving(env, ALL_ROLES, roles=ALL_ROLES) as client:
        await wait_for(lambda: indexed_through(env, 0), timeout=30)  # the default space exists
    async with serving(env, ROLES, roles=ROLES) as client:
        made = []
        for scope in scopes:
            await client.create_scope(scope)
            made.append(await client.create(scope, "claim", {"statement": f"in {scope}"}, ACTOR, PROVENANCE))
    sent_before = sum((await listed(env)).values())
    # The writer is away: the indexer indexes everything and queues its entries.
    indexer = IndexerProcess(env, tmp_path / "indexer1.log")
    try:
        await wait_for(lambda: _queued_through(env, made[-1]["ledger_sequence"]), timeout=60)
        async with serving(env, ROLES, roles=ROLES):
            # Kill it once the writer appended some entries of the pass, before the pass committed.
            await wait_for(lambda: _sent_more_than(env, sent_before), timeout=60, interval=0.005)
            indexer.kill()
            assert await _outbox(env) > 0, "the kill came too late to test the window"
            indexer = IndexerProcess(env, tmp_path / "indexer2.log")
            await wait_for(lambda: indexed_through(env, made[-1]["ledger_sequence"]), timeout=60)
    finally:
        indexer.kill()
    counts = await listed(env)
    assert max(counts.values()) == 1
    versions = await vector_versions(env)
    assert all(versions[m["object_id"]] == m["version_id"] for m in made)
    assert {v for _, _, v in counts} >= {m["version_id"] for m in made}


async def _outbox(env: Env) -> int:
    async with await psycopg.AsyncConnection.connect(env.database_url, autocommit=True) as conn:
        return int((await (await conn.execute("SELECT count(*) FROM index_outbox")).fetchone() or (0,))[0])


async def _queued_through(env: Env, sequence: int) -> bool:
    return await _checkpoint(env) >= sequence and await _outbox(env) > 0


async def _sent_more_than(env: Env, before: int) -> bool:
    return sum((await listed(env)).values()) > before
