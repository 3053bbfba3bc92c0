"""`pamledger replay` on a ledger of several partitions: over all of them (the default) a rebuild equals the
whole live projection and `--swap` repairs a damaged row in any partition, the projectors going on after it;
`--partition P` rebuilds and compares that partition's scopes only; `--scope` reads the scope's own partition,
where `--to-sequence` is a sequence of that partition; what cannot be meant is refused, naming why.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import psycopg
import pytest

from infra.ledger import ledger_head
from infra.ledger_identity import checkpoint_disagreement, ledger_identity
from infra.partitions import partition_of
from infra.projections import PROJECTION, partition_checkpoint
from pamledger_client.client import MemoryClient
from projector.replay import ReplayOptions, replay
from tests.conftest import ACTOR, PROVENANCE, Env, Servers, fresh_database, fresh_settings, serving, \
    service_environment, wait_for

ROOT = Path(__file__).resolve().parents[2]
PARTITIONS = 3
ROLES = ("writer", "query", "projector")


def scope_in(partition: int, label: str) -> str:
    """A scope id that hashes to `partition`."""
    return next(s for i in range(1000) if partition_of(s := f"workspace:{label}-{i}", PARTITIONS) == partition)


SCOPES = [scope_in(p, "replay") for p in range(PARTITIONS)]


@pytest.fixture(scope="module")
def env(servers: Servers) -> Env:
    return Env(servers, fresh_database(servers, "partreplay"), fresh_settings("partreplay", partitions=PARTITIONS))


@pytest.fixture(scope="module")
async def client(env: Env) -> Any:
    async with serving(env, ROLES, roles=ROLES) as c:
        c.retries = 3
        yield c


async def projected(env: Env) -> bool:
    """Every partition's projection checkpoint is at its partition's head."""
    async with await psycopg.AsyncConnection.connect(env.database_url) as conn:
        for p in range(PARTITIONS):
            row = await (await conn.execute("SELECT ledger_sequence FROM projection_checkpoints WHERE projection = %s",
                                            (partition_checkpoint(PROJECTION, p),))).fetchone()
            if row is None or int(row[0]) < await ledger_head(conn, p):
                return False
    return True


@pytest.fixture(scope="module")
async def history(client: MemoryClient, env: Env) -> dict[str, list[str]]:
    """Creates, updates, a transition, a relationship and a delete in a scope of every partition."""
    made: dict[str, list[str]] = {}
    for scope in SCOPES:
        await client.create_scope(scope)
        objects = [await client.create(scope, "claim", {"statement": f"fact {i} of {scope}"}, ACTOR, PROVENANCE)
                   for i in range(6)]
        objects[0] = await client.update(scope, objects[0]["object_id"], objects[0]["version_id"],
                                         {"statement": "fact 0, corrected"}, ACTOR, PROVENANCE)
        await client.transition(scope, objects[1]["object_id"], objects[1]["version_id"], "validation",
                                "corroborated", ACTOR, PROVENANCE)
        await client.command("relate", {"scope_id": scope, "source_object_id": objects[2]["object_id"],
                                        "target_object_id": objects[3]["object_id"], "relationship_type": "supports",
                                        "directionality": "directed", "actor": ACTOR, "provenance": PROVENANCE})
        await client.delete(scope, objects[4]["object_id"], objects[4]["version_id"], ACTOR, PROVENANCE)
        made[scope] = [o["object_id"] for o in objects]
    await wait_for(lambda: projected(env), timeout=60)
    return made


def options(**given: Any) -> ReplayOptions:
    return ReplayOptions(partitions=tuple(range(PARTITIONS)), ledger_partitions=PARTITIONS, **given)


async def scalar(env: Env, statement: str, *params: Any) -> Any:
    async with await psycopg.AsyncConnection.connect(env.database_url) as conn:
        row = await (await conn.execute(statement, params)).fetchone()
        assert row is not None
        return row[0]


def replay_cli(env: Env, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "pamledger", "replay", *args], cwd=ROOT, text=True,
                          capture_output=True, timeout=120, env=service_environment(env))


async def test_every_partition_s_checkpoint_is_stamped_with_its_own_ledger_id(history: dict[str, list[str]],
                                                                             env: Env) -> None:
    """What a restarted projector checks before it follows (its checkpoint is this partition's ledger's): a
    checkpoint of partition p > 0 used to carry partition 0's ledger id, so after a restart partitions 1+
    were refused as "a checkpoint of another ledger" and stopped projecting."""
    async with await psycopg.AsyncConnection.connect(env.database_url, autocommit=True) as conn:
        for p in range(PARTITIONS):
            assert await checkpoint_disagreement(conn, partition_checkpoint(PROJECTION, p), p) is None
            stamped = await scalar(env, "SELECT ledger_id FROM projection_checkpoints WHERE projection = %s",
                                   partition_checkpoint(PROJECTION, p))
            assert stamped == await ledger_identity(conn, p)
        # A ledger partitioned before the fix: migration 025 gives each such row its own partition's id.
        wrong = partition_checkpoint(PROJECTION, 1)
        await conn.execute("UPDATE projection_checkpoints SET ledger_id = pamledger_ledger_id(0) WHERE projection = %s",
                           (wrong,))
        assert await checkpoint_disagreement(conn, wrong, 1) is not None
        await conn.execute((ROOT / "infra" / "sql" / "025_partition_checkpoint_identity.sql").read_text())
        assert await checkpoint_disagreement(conn, wrong, 1) is None


async def test_every_partition_is_rebuilt_by_default_and_equals_the_live_projection(
        history: dict[str, list[str]], env: Env) -> None:
    done = replay_cli(env, "--verify")
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert report["verify"]["equal"] and report["verify"]["relationships"]["equal"]
    assert report["rows"] == await scalar(env, "SELECT count(*) FROM current_objects") > 0
    assert report["relationships"]["rows"] == await scalar(env, "SELECT count(*) FROM current_relationships") >= 3
    assert report["events"] == await scalar(env, "SELECT count(*) FROM ledger")
    async with await psycopg.AsyncConnection.connect(env.database_url) as conn:
        heads = {str(p): await ledger_head(conn, p) for p in range(PARTITIONS)}
    assert report["through_sequence"] == heads and report["live_checkpoint"] == heads
    assert all(head > 0 for head in heads.values())  # every partition holds events: the rebuild read each


async def test_one_partition_s_rebuild_holds_and_compares_its_scopes_only(history: dict[str, list[str]],
                                                                          env: Env) -> None:
    done = replay_cli(env, "--verify", "--partition", "1")
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert report["verify"]["equal"] and report["verify"]["relationships"]["equal"]
    theirs = await scalar(env, "SELECT count(*) FROM current_objects WHERE scope_id = %s", SCOPES[1])
    assert report["rows"] == report["verify"]["live_rows"] == theirs > 0
    assert report["events"] == await scalar(env, "SELECT count(*) FROM ledger WHERE partition = 1")
    assert set(report["through_sequence"]) == {"1"}


async def test_a_scope_is_read_in_its_own_partition_up_to_a_sequence_of_it(history: dict[str, list[str]],
                                                                           env: Env) -> None:
    scope = SCOPES[2]
    created = await scalar(env, "SELECT ledger_sequence FROM ledger WHERE partition = 2 AND object_id = %s"
                                " ORDER BY ledger_sequence LIMIT 1", history[scope][5])  # its create
    report = await replay(env.database_url, ReplayOptions(scope_id=scope, to_sequence=created,
                                                          partitions=(2,), ledger_partitions=PARTITIONS))
    assert report["through_sequence"] == {"2": created}
    assert report["events"] == await scalar(
        env, "SELECT count(*) FROM ledger WHERE partition = 2 AND scope_id = %s AND ledger_sequence <= %s",
        scope, created) > 1
    beyond = replay_cli(env, "--scope", scope, "--to-sequence", str(created + 10_000))
    assert beyond.returncode == 1
    refusal = json.loads(beyond.stderr.strip().splitlines()[-1])["error"]
    assert refusal["code"] == "invalid_request" and refusal["details"]["partition"] == 2


@pytest.mark.parametrize("args, says", [
    (("--swap", "--partition", "1"), "--swap replaces the whole projection"),
    (("--to-sequence", "3"), "--to-sequence is a sequence of one partition"),
    (("--partition", str(PARTITIONS)), f"--partition {PARTITIONS}: this ledger has partitions 0 to {PARTITIONS - 1}"),
    (("--partition", "-1"), "--partition -1: this ledger has partitions 0 to"),
    (("--scope", SCOPES[1], "--partition", "0"), f"is in partition 1, not in --partition 0"),
])
def test_what_cannot_be_meant_is_refused(history: dict[str, list[str]], env: Env, args: tuple[str, ...],
                                         says: str) -> None:
    done = replay_cli(env, *args)
    assert done.returncode == 1 and done.stdout == ""
    refusal = json.loads(done.stderr.strip().splitlines()[-1])["error"]
    assert refusal["code"] == "invalid_request" and says in refusal["message"]


async def test_a_swap_repairs_a_damaged_row_of_any_partition_and_the_projectors_go_on(
        history: dict[str, list[str]], client: MemoryClient, env: Env) -> None:
    scope, damaged = SCOPES[2], history[SCOPES[2]][5]
    async with await psycopg.AsyncConnection.connect(env.database_url, autocommit=True) as conn:
        await conn.execute("UPDATE current_objects SET ledger_sequence = ledger_sequence + 1000"
                           " WHERE scope_id = %s AND object_id = %s", (scope, damaged))
    found = await replay(env.database_url, options(verify=True))
    assert not found["verify"]["equal"]
    assert found["verify"]["first_differences"] == [{"scope_id": scope, "object_id": damaged, "problem": "rows differ"}]
    swapped = await replay(env.database_url, options(swap=True))
    assert swapped["swapped"] and "checkpoint_reset" not in swapped, swapped.get("checkpoint_reset")
    assert (await replay(env.database_url, options(verify=True)))["verify"]["equal"]
    # Each partition's projector goes on into the swapped-in table.
    for scope in SCOPES:
        made = await client.create(scope, "claim", {"statement": "after the swap"}, ACTOR, PROVENANCE)
        await wait_for(lambda: projected(env), timeout=60)
        assert await scalar(env, "SELECT count(*) FROM current_objects WHERE scope_id = %s AND object_id = %s",
                            scope, made["object_id"]) == 1
    assert (await replay(env.database_url, options(verify=True)))["verify"]["equal"]



def test_verify_of_a_partition_the_ledger_does_not_have_is_refused(history: dict[str, list[str]], env: Env) -> None:
    """Not an empty partition checked and found ok."""
    done = subprocess.run([sys.executable, "-m", "pamledger", "verify", "--partition", str(PARTITIONS)], cwd=ROOT,
                          text=True, capture_output=True, timeout=120, env=service_environment(env))
    refusal = json.loads(done.stderr.strip().splitlines()[-1])["error"]
    assert done.returncode == 1 and done.stdout == "" and refusal["code"] == "invalid_request"
    assert refusal["details"] == {"partition": PARTITIONS, "partitions": PARTITIONS}


@pytest.mark.parametrize("command", [("replay", "--verify"), ("replay", "--swap"), ("verify",),
                                     ("serve", "--roles", "projector"), ("serve", "--roles", "query")])
def test_a_command_with_another_partition_count_is_refused(history: dict[str, list[str]], env: Env,
                                                           command: tuple[str, ...]) -> None:
    """With PAMLEDGER_PARTITIONS unset (1) on a ledger of 3, `replay --swap` of "every" partition would have
    replaced the projection by partition 0's rows, and a projector would have followed partition 0 alone."""
    done = subprocess.run([sys.executable, "-m", "pamledger", *command], cwd=ROOT, text=True, capture_output=True,
                          timeout=120, env={**service_environment(env), "PAMLEDGER_PARTITIONS": "1"})
    said = done.stderr.strip().splitlines()[-1]
    assert done.returncode != 0 and done.stdout == "", done.stderr
    assert f"made with partitions={PARTITIONS}" in said and "ask for partitions=1" in said
    if command[0] != "serve":
        assert json.loads(said)["error"]["details"] == {"recorded_partitions": PARTITIONS, "partitions": 1}
