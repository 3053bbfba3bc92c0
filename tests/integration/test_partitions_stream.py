"""`pamledger stream rebuild` over a ledger of several partitions: every partition's stream is made again from
its own ledger rows (or one, `--partition N`), a running projector and subscription go on, and one partition's
cut-off tail refuses the whole command, naming that partition, until `--force`.

The service runs in this event loop (writer, query, projector, gateway: a follower and a gateway per
partition); the CLI runs as a real subprocess, as an operator runs it.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import psycopg

from infra.partitions import partition_of, partition_stream
from pamledger.cli_ledger import identity_report
from pamledger_client.client import MemoryClient
from tests.conftest import ACTOR, PROVENANCE, Env, Servers, fresh_database, fresh_settings, serving, \
    service_environment, take, wait_for

ROOT = Path(__file__).resolve().parents[2]
PARTITIONS = 4
ROLES = ("writer", "query", "projector", "gateway")


def scopes_by_partition() -> dict[int, str]:
    """One scope id per partition (the assignment is a hash of the id)."""
    found: dict[int, str] = {}
    i = 0
    while len(found) < PARTITIONS:
        found.setdefault(partition_of(f"workspace:stream-{i}", PARTITIONS), f"workspace:stream-{i}")
        i += 1
    return found


def new_env(servers: Servers, label: str) -> Env:
    return Env(servers, fresh_database(servers, label), fresh_settings(label, partitions=PARTITIONS))


def pamledger(env: Env, *args: str, partitions: int = PARTITIONS) -> subprocess.CompletedProcess[str]:
    """`python -m pamledger ARGS` against the env's ledger of PARTITIONS partitions (with that setting)."""
    return subprocess.run([sys.executable, "-m", "pamledger", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=180, env=service_environment(env, PAMLEDGER_PARTITIONS=str(partitions)))


async def heads(env: Env) -> dict[int, int]:
    async with await psycopg.AsyncConnection.connect(env.database_url) as conn:
        cur = await conn.execute("SELECT partition, max(ledger_sequence) FROM ledger GROUP BY partition")
        return {int(p): int(h) for p, h in await cur.fetchall()}


async def stream_lasts(js: Any, env: Env) -> dict[int, int | None]:
    """Each partition's stream's last sequence (None: it has no stream)."""
    from nats.js.errors import NotFoundError

    out: dict[int, int | None] = {}
    for p in range(PARTITIONS):
        try:
            out[p] = int((await js.stream_info(partition_stream(env.settings.stream_name, p))).state.last_seq)
        except NotFoundError:
            out[p] = None
    return out


async def relayed(js: Any, env: Env) -> bool:
    found = await heads(env)
    return len(found) == PARTITIONS and await stream_lasts(js, env) == found


async def creates_of(env: Env, scope_id: str) -> list[int]:
    async with await psycopg.AsyncConnection.connect(env.database_url) as conn:
        cur = await conn.execute("SELECT ledger_sequence FROM ledger WHERE scope_id = %s"
                                 " AND event_type = 'object_created' ORDER BY ledger_sequence", (scope_id,))
        return [int(row[0]) for row in await cur.fetchall()]


async def write_everywhere(client: MemoryClient, scopes: dict[int, str], rounds: int) -> None:
    for round_ in range(rounds):
        for scope_id in scopes.values():
            await client.create(scope_id, "claim", {"round": round_}, ACTOR, PROVENANCE)


async def test_every_partition_s_stream_is_rebuilt_from_its_own_ledger_and_followers_go_on(servers: Servers) -> None:
    env = new_env(servers, "pstream")
    scopes = scopes_by_partition()
    async with serving(env, ROLES, roles=ROLES) as client:
        client.retries = 5
        for scope_id in scopes.values():
            await client.create_scope(scope_id)
        subscription = await client.subscribe(scopes[2], ACTOR, after_sequence=0,
                                              filter={"event_classes": ["object_created"]})
        await write_everywhere(client, scopes, 3)
        before = await take(subscription, 3)
        js = client.nc.jetstream()
        await wait_for(lambda: relayed(js, env), timeout=60)
        await js.delete_stream(partition_stream(env.settings.stream_name, 2))  # lost, as by an operator's mistake

        done = await asyncio.to_thread(pamledger, env, "stream", "rebuild")
        assert done.returncode == 0, done.stdout + done.stderr
        report = json.loads(done.stdout)
        found = await heads(env)
        assert sorted(report["partitions"]) == [str(p) for p in range(PARTITIONS)]
        for p in range(PARTITIONS):
            each = report["partitions"][str(p)]
            assert each["partition"] == p and each["stream"] == partition_stream(env.settings.stream_name, p)
            assert each["ledger_head"] == each["republished_through"] == found[p], each
            assert (each["previous"] is None) == (p == 2), each  # only partition 2's stream was gone
        assert report["summary"]["streams_rebuilt"] == PARTITIONS
        assert report["summary"]["republished"] == sum(found.values())
        assert await stream_lasts(js, env) == found  # every stream's last sequence is its partition's head

        # The running followers go on: new writes reach the subscription (once, in order) and queries.
        await write_everywhere(client, scopes, 2)
        created = await client.create(scopes[2], "claim", {"after": "rebuild"}, ACTOR, PROVENANCE)
        # The last event `take` got is handed out again (it left the loop before acknowledging it: README).
        after = await take(subscription, 4)
        assert after[0]["ledger_sequence"] == before[-1]["ledger_sequence"]
        sequences = [e["ledger_sequence"] for e in before + after[1:]]
        assert sequences == await creates_of(env, scopes[2]), "the subscription missed or repeated an event"
        seen = await client.query(scopes[2], wait_ms=10_000, min_sequence=created["ledger_sequence"],
                                  validation_states=["unverified"])
        assert seen["min_sequence_reached"] and len(seen["items"]) == 6, seen
        await subscription.close()
        await wait_for(lambda: relayed(js, env), timeout=60)
    verified = await asyncio.to_thread(pamledger, env, "verify")
    assert verified.returncode == 0 and json.loads(verified.stdout)["ok"], verified.stdout + verified.stderr


async def test_a_cut_off_tail_in_one_partition_refuses_the_rebuild_naming_it_until_forced(servers: Servers) -> None:
    env = new_env(servers, "pstreamcut")
    scopes = scopes_by_partition()
    async with serving(env, ROLES, roles=ROLES) as client:
        for scope_id in scopes.values():
            await client.create_scope(scope_id)
        await write_everywhere(client, scopes, 3)
        js = client.nc.jetstream()
        await wait_for(lambda: relayed(js, env), timeout=60)
    found = await heads(env)
    async with await psycopg.AsyncConnection.connect(env.database_url, autocommit=True) as conn:
        await conn.execute("SET session_replication_role = replica")  # no triggers: what a superuser can do
        cur = await conn.execute("SELECT ledger_sequence, event_id FROM ledger WHERE partition = 1"
                                 " AND ledger_sequence > %s ORDER BY ledger_sequence", (found[1] - 2,))
        cut = [{"sequence": int(s), "event_id": e} for s, e in await cur.fetchall()]
        await conn.execute("DELETE FROM ledger WHERE partition = 1 AND ledger_sequence > %s", (found[1] - 2,))

    import nats

    nc = await nats.connect(env.nats_url)
    try:
        js = nc.jetstream()
        created = {p: (await js.stream_info(partition_stream(env.settings.stream_name, p))).created
                   for p in range(PARTITIONS)}
        # What `pamledger status` says: every partition's ledger id against its stream's, partition 1's ahead.
        shown = await identity_report(env.settings, nc, env.database_url)
        assert not shown["agrees"] and all(p.startswith("partition 1: ") for p in shown["problems"]), shown
        assert shown["problems"][0].startswith("partition 1: the stream is ahead of the ledger"), shown  # and its
        # projection checkpoint (`replay --swap`: not built for several partitions)
        assert [p for p, each in shown["partitions"].items() if not each["agrees"]] == ["1"]
        assert all(each["stream_ledger_id"] == each["ledger_id"] for each in shown["partitions"].values())

        refused = await asyncio.to_thread(pamledger, env, "stream", "rebuild")
        assert refused.returncode != 0 and not refused.stdout, refused
        error = json.loads(refused.stderr.strip().splitlines()[-1])["error"]
        assert error["code"] == "invalid_request" and "partition 1's stream" in error["message"], error
        assert "--force" in error["message"]
        assert list(error["details"]["partitions"]) == ["1"]
        assert error["details"]["partitions"]["1"]["would_discard"] == cut
        assert error["details"]["partitions"]["1"]["ledger_head"] == found[1] - 2
        assert {p: (await js.stream_info(partition_stream(env.settings.stream_name, p))).created
                for p in range(PARTITIONS)} == created, "a refused rebuild touched a stream"

        outside = await asyncio.to_thread(pamledger, env, "stream", "rebuild", "--partition", str(PARTITIONS))
        assert outside.returncode != 0 and "--partition 4" in outside.stderr, outside
        unset = await asyncio.to_thread(pamledger, env, "stream", "rebuild", "--force", partitions=1)
        assert unset.returncode != 0 and f"made with partitions={PARTITIONS}" in unset.stderr, unset  # not p0 alone

        forced = await asyncio.to_thread(pamledger, env, "stream", "rebuild", "--partition", "1", "--force")
        assert forced.returncode == 0, forced.stdout + forced.stderr
        report = json.loads(forced.stdout)
        assert list(report["partitions"]) == ["1"] and report["summary"]["streams_rebuilt"] == 1
        assert report["partitions"]["1"]["previous"]["discarded"] == cut
        assert report["partitions"]["1"]["republished_through"] == found[1] - 2
        assert await stream_lasts(js, env) == {**found, 1: found[1] - 2}
        after = {p: (await js.stream_info(partition_stream(env.settings.stream_name, p))).created
                 for p in range(PARTITIONS)}
        assert after[1] != created[1] and {p: c for p, c in after.items() if p != 1} == \
            {p: c for p, c in created.items() if p != 1}, "--partition 1 rebuilt another partition's stream"
    finally:
        await nc.close()
