"""Evaluation runs against the real service: the same scripted run against the same sealed snapshot twice
gives a byte-identical evaluation ledger, and the run id is in every version's provenance and entry.

The twice-run: seal a snapshot declaring a clock and a seed, take a `pamledger backup`, run the script
(eval start, creates, an update, a transition, a relate, eval end), dump the evaluation scope's rows (ledger,
versions, content, the run's row: every column, in order), stop, `pamledger restore --replace` the backup,
start, run the same script, dump, compare the bytes. Both runs start from the same ledger head and hash, so
the global sequences and the hash chain are compared too, not only what the run wrote itself.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import psycopg
import pytest

from pamledger_client.client import MemoryClient, PamspecError
from tests.conftest import ACTOR, Env, run_cli, serving
from tests.integration.test_pamspec_conformance import validator

pytestmark = pytest.mark.profile("PAMSPEC-Evaluation")  # partially built, not claimed (docs/implementation-report.md)

SCOPE = "workspace:evalruns"
RUN = "run:twice"
EVAL = f"eval:{RUN}"
PROV = {"provenance_id": "prov:eval", "actor": ACTOR, "activity": "evaluation script"}
BASE_OBJECT = "mem:evalruns-base"
OTHER_BASE_OBJECT = "mem:evalruns-base-2"
CLOCK = {"clock_ref": "clock:eval:twice", "start_at": "2026-07-17T00:00:00Z", "tick_ms": 250}
_DUMPS = (  # every column of the evaluation scope's rows, in a fixed order
    ("ledger", "SELECT * FROM ledger WHERE scope_id = %s ORDER BY partition, ledger_sequence"),
    ("versions", "SELECT * FROM memory_versions WHERE scope_id = %s ORDER BY object_id, sequence"),
    ("content", "SELECT * FROM content_store WHERE scope_id = %s ORDER BY content_digest"),
    ("run", "SELECT * FROM evaluation_runs WHERE scope_id = %s"),
)


@dataclass
class Runs:
    dumps: list[dict[str, list[tuple[Any, ...]]]] = field(default_factory=list)
    results: list[dict[str, Any]] = field(default_factory=list)
    base_rows: list[int] = field(default_factory=list)  # the base scope's ledger rows after each run
    after_end: dict[str, PamspecError] = field(default_factory=dict)
    diff: dict[str, Any] = field(default_factory=dict)  # the run's snapshot against the evaluation scope
    cli: dict[str, dict[str, Any]] = field(default_factory=dict)  # pamledger snapshot create / eval start|end
    base_after: dict[str, Any] = field(default_factory=dict)  # the base object, read in its scope after run 1
    eval_after: dict[str, Any] = field(default_factory=dict)  # the same object read through the evaluation scope


async def script(client: MemoryClient, snapshot_id: str) -> dict[str, Any]:
    """The scripted run: the same commands, with the script's own operation ids (the SDK's are random)."""
    done: dict[str, Any] = {"start": await client.eval_start(SCOPE, snapshot_id, ACTOR, operation_id="op:script:0")}
    a = await client.create(EVAL, "claim", {"statement": "cats purr"}, ACTOR, PROV, operation_id="op:script:1")
    b = await client.create(EVAL, "claim", {"statement": "dogs bark"}, ACTOR, PROV, operation_id="op:script:2")
    a2 = await client.update(EVAL, a["object_id"], a["version_id"], {"statement": "cats purr loudly"}, ACTOR,
                             PROV, operation_id="op:script:3")
    b2 = await client.transition(EVAL, b["object_id"], b["version_id"], "lifecycle", "deprecated", ACTOR, PROV,
                                 operation_id="op:script:4")
    rel = await client.relate(EVAL, a["object_id"], b["object_id"], "contradicts", ACTOR, PROV,
                              operation_id="op:script:5")
    done["forked_read"] = await client.read(EVAL, BASE_OBJECT)  # the snapshot's, through the evaluation scope
    forked = await client.update(EVAL, BASE_OBJECT, done["forked_read"]["version_id"], {"statement": "changed in eval"},
                                 ACTOR, PROV, operation_id="op:script:fork")
    to_base = await client.relate(EVAL, a["object_id"], OTHER_BASE_OBJECT, "supports", ACTOR, PROV,
                                  operation_id="op:script:relate-base")  # an endpoint the run never wrote
    done.update(a=a, b=b, a2=a2, b2=b2, rel=rel, forked=forked, to_base=to_base)
    done["query"] = await client.query(EVAL, evaluation_run_id=RUN, lifecycle_states=["active", "deprecated"],
                                       validation_states=["unverified", "corroborated"])
    done["query_all"] = await client.query(EVAL, lifecycle_states=["active", "deprecated"],
                                           validation_states=["unverified", "corroborated"])
    done["reads"] = [await client.read(EVAL, o) for o in (a["object_id"], b["object_id"], rel["relationship_id"])]
    done["end"] = await client.eval_end(EVAL, ACTOR, operation_id="op:script:6")
    return done


async def dump(env: Env) -> dict[str, list[tuple[Any, ...]]]:
    async with await psycopg.AsyncConnection.connect(env.database_url, autocommit=True) as conn:
        return {name: await (await conn.execute(statement, (EVAL,))).fetchall() for name, statement in _DUMPS}


async def base_rows(env: Env) -> int:
    async with await psycopg.AsyncConnection.connect(env.database_url, autocommit=True) as conn:
        row = await (await conn.execute("SELECT count(*) FROM ledger WHERE scope_id = %s", (SCOPE,))).fetchone()
        return int(row[0]) if row else 0


def cli_json(env: Env, *args: str) -> dict[str, Any]:
    done = run_cli(env, *args)
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout)  # type: ignore[no-any-return]


@pytest.fixture(scope="module")
async def runs(env: Env, tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Runs]:
    found = Runs()
    backup = tmp_path_factory.mktemp("evalruns") / "before"
    async with serving(env) as client:
        await client.create_scope(SCOPE)
        await client.create(SCOPE, "claim", {"statement": "the base holds this"}, ACTOR, PROV, object_id=BASE_OBJECT)
        await client.create(SCOPE, "claim", {"statement": "and this"}, ACTOR, PROV, object_id=OTHER_BASE_OBJECT)
        sealed = await client.snapshot_create(SCOPE, ACTOR, snapshot_id="snap:evalruns", evaluation_run_id=RUN,
                                              deterministic_clock=CLOCK, deterministic_rng_seed=20261204)
        cli_json(env, "backup", "--out", str(backup), "--quiet")
        found.results.append(await script(client, sealed["snapshot"]["snapshot_id"]))
        found.dumps.append(await dump(env))
        found.base_rows.append(await base_rows(env))
        found.base_after = await client.read(SCOPE, BASE_OBJECT)
        found.eval_after = await client.read(EVAL, BASE_OBJECT)
        for name, write in (
                ("create", client.create(EVAL, "claim", {"statement": "late"}, ACTOR, PROV)),
                ("end", client.eval_end(EVAL, ACTOR))):
            try:
                await write
            except PamspecError as exc:
                found.after_end[name] = exc
    cli_json(env, "restore", str(backup), "--replace", "--quiet")
    async with serving(env) as client:
        found.results.append(await script(client, "snap:evalruns"))
        found.dumps.append(await dump(env))
        found.base_rows.append(await base_rows(env))
        for name, args in (  # the CLI, in a thread: it talks to the service this event loop runs
                ("seal", ("snapshot", "create", SCOPE, "--id", "snap:cli", "--evaluation-run-id", "run:cli",
                          "--clock", "2026-07-17T00:00:00Z,1000", "--seed", "7")),
                ("start", ("eval", "start", SCOPE, "snap:cli")), ("end", ("eval", "end", "eval:run:cli")),
                ("seal_without_run", ("snapshot", "create", SCOPE, "--id", "snap:cli-norun"))):
            found.cli[name] = await asyncio.to_thread(cli_json, env, *args)
        try:  # a snapshot without a run id, and no evaluation scope named: the client says so, as an envelope
            await client.eval_start(SCOPE, "snap:cli-norun", ACTOR)
        except PamspecError as exc:
            found.after_end["start_without_run_id"] = exc
        found.diff = await client.eval_diff(EVAL, "snap:evalruns")
        try:
            await client.eval_diff(SCOPE, "snap:evalruns")  # the base holds no run: a second snapshot is needed
        except PamspecError as exc:
            found.after_end["diff_outside_a_run"] = exc
        found.cli["diff"] = await asyncio.to_thread(cli_json, env, "eval", "diff", EVAL, "snap:evalruns")
        verified = await asyncio.to_thread(run_cli, env, "verify")
        found.cli["verify"] = json.loads(verified.stdout)
    yield found


def test_the_same_script_against_the_same_snapshot_twice_gives_the_same_evaluation_ledger(runs: Runs) -> None:
    one, two = runs.dumps
    assert len(one["ledger"]) == 9 and len(one["versions"]) == 7 and len(one["run"]) == 1
    assert repr(one).encode() == repr(two).encode()


def test_the_runs_times_come_from_its_clock_one_tick_per_entry(runs: Runs) -> None:
    times = [json.loads(bytes(row[9]))["recorded_at"] for row in runs.dumps[0]["ledger"]]
    assert times[:3] == ["2026-07-17T00:00:00Z", "2026-07-17T00:00:00.250000Z", "2026-07-17T00:00:00.500000Z"]


def test_every_entry_of_the_run_names_it_and_the_base_scope_is_untouched(runs: Runs) -> None:
    for row in runs.dumps[0]["ledger"]:
        assert json.loads(bytes(row[9]))["payload"]["evaluation_run_id"] == RUN
    assert runs.base_rows[0] == runs.base_rows[1] == 3  # its creates, the seal, nothing of the run


def test_every_version_of_the_run_names_it_in_provenance_and_fits_the_official_schemas(runs: Runs) -> None:
    objects, relationships = validator("memory-object.schema.json"), validator("relationship.schema.json")
    for read in runs.results[0]["reads"]:
        envelope = read["envelope"] if "envelope" in read else read
        assert f"evaluation_run:{RUN}" in envelope["provenance"]["evidence_refs"]
        schema = relationships if "relationship_id" in envelope else objects
        assert [e.message for e in schema.iter_errors(envelope)] == []


def test_a_query_by_evaluation_run_id_finds_the_runs_objects(runs: Runs) -> None:
    found = runs.results[0]["query"]
    ids = {item["envelope"]["object_id"] if "envelope" in item else item["object_id"] for item in found["items"]}
    assert ids == {runs.results[0]["a"]["object_id"], runs.results[0]["b"]["object_id"], BASE_OBJECT}


def test_after_eval_end_the_scope_takes_no_writes(runs: Runs) -> None:
    assert {name: exc.code for name, exc in runs.after_end.items()} == {
        "create": "invalid_state_transition", "end": "invalid_state_transition",
        "diff_outside_a_run": "invalid_request", "start_without_run_id": "invalid_request"}
    assert runs.after_end["create"].details["rule"] == "evaluation_run_ended"


def test_the_evaluation_scope_reads_the_snapshots_objects_and_writes_them_in_its_own_scope_only(runs: Runs) -> None:
    done = runs.results[0]
    assert done["forked_read"]["scope_id"] == SCOPE  # not written by the run: the snapshot's version
    assert done["forked_read"]["canonical_content"] == {"statement": "the base holds this"}
    forked = done["forked"]["envelope"] if "envelope" in done["forked"] else done["forked"]
    assert (forked["scope_id"], forked["sequence"]) == (EVAL, 1)  # copy on write: the run's first version of it
    assert runs.eval_after["canonical_content"] == {"statement": "changed in eval"}
    assert runs.base_after["canonical_content"] == {"statement": "the base holds this"}  # the base is untouched
    assert runs.base_after["version_id"] == done["forked_read"]["version_id"]


def test_the_cli_seals_with_a_clock_and_seed_and_starts_and_ends_a_run_without_a_credential_where_auth_is_off(
        runs: Runs) -> None:
    sealed = runs.cli["seal"]
    assert sealed["deterministic_clock"]["tick_ms"] == 1000 and sealed["deterministic_rng_seed"] == 7
    run = runs.cli["start"]["evaluation_run"]
    assert (run["scope_id"], run["run_id"], run["seed"], run["tick_ms"]) == ("eval:run:cli", "run:cli", 7, 1000)
    assert runs.cli["start"]["credential"] is None
    assert runs.cli["end"]["evaluation_run"]["ended"] is True and runs.cli["end"]["credential_revoked"] is False


def test_verify_passes_over_a_ledger_holding_evaluation_runs(runs: Runs) -> None:
    assert runs.cli["verify"]["ok"] is True, runs.cli["verify"]


def test_a_diff_of_the_runs_snapshot_with_the_evaluation_scope_shows_what_the_run_wrote(runs: Runs) -> None:
    done, diff = runs.results[1], runs.diff
    assert {i["object_id"] for i in diff["added"]} == {done["a"]["object_id"], done["b"]["object_id"],
                                                       done["rel"]["relationship_id"], done["to_base"]["relationship_id"]}
    assert diff["removed"] == [] and [c["object_id"] for c in diff["changed"]] == [BASE_OBJECT]
    changed = diff["changed"][0]
    assert changed["from_version_id"] == done["forked_read"]["version_id"]
    assert [v["scope_id"] for v in changed["versions"]] == [EVAL]  # only what the run wrote: A is its snapshot
    assert [e["event"]["event_type"] for e in changed["events"]] == ["object_updated"]
    assert diff["to"]["evaluation_run_id"] == RUN and diff["direction"] == "forward"
    assert runs.cli["diff"] == diff


async def test_the_runs_clock_continues_across_a_writer_restart(env: Env, runs: Runs) -> None:
    """The entry count a command's time and ids come from is the ledger's, not the writer's memory."""
    times = []
    async with serving(env) as client:
        await client.snapshot_create(SCOPE, ACTOR, snapshot_id="snap:restart", evaluation_run_id="run:restart",
                                     deterministic_clock=CLOCK, deterministic_rng_seed=1)
        await client.eval_start(SCOPE, "snap:restart", ACTOR)
        times.append((await client.create("eval:run:restart", "claim", {"statement": "one"}, ACTOR,
                                          PROV))["envelope"]["committed_at"])
    async with serving(env) as client:
        times.append((await client.create("eval:run:restart", "claim", {"statement": "two"}, ACTOR,
                                          PROV))["envelope"]["committed_at"])
    assert times == ["2026-07-17T00:00:00.250000Z", "2026-07-17T00:00:00.500000Z"]


async def test_verify_names_a_run_row_its_ledger_entry_does_not_account_for(env: Env, runs: Runs) -> None:
    async with await psycopg.AsyncConnection.connect(env.database_url, autocommit=True) as conn:
        await conn.execute("UPDATE evaluation_runs SET evaluation_run_id = 'run:forged' WHERE scope_id = %s", (EVAL,))
        try:
            done = await asyncio.to_thread(run_cli, env, "verify")
        finally:
            await conn.execute("UPDATE evaluation_runs SET evaluation_run_id = %s WHERE scope_id = %s", (RUN, EVAL))
    found = json.loads(done.stdout)
    assert done.returncode != 0 and found["check"] == "evaluation_runs.started_entry", found


def test_a_query_in_the_evaluation_scope_sees_the_snapshots_objects_it_has_not_written(runs: Runs) -> None:
    done = runs.results[0]
    found = {item["envelope"]["object_id"]: item["envelope"] for item in done["query_all"]["items"]}
    assert set(found) == {done["a"]["object_id"], done["b"]["object_id"], BASE_OBJECT, OTHER_BASE_OBJECT}
    assert found[OTHER_BASE_OBJECT]["scope_id"] == SCOPE  # the snapshot's, never written by the run
    assert (found[BASE_OBJECT]["scope_id"], found[BASE_OBJECT]["canonical_content"]) == (
        EVAL, {"statement": "changed in eval"})  # the run's own version hides the snapshot's
