"""Sealed evaluation snapshots against the real service: sealing, frozen ids, and read/history/query at a
snapshot answering the same bytes after later updates, deletes and creates, erasure aside (and counted)."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import msgspec
import psycopg
import pytest

from pamledger_client.protocol.subjects import command_subject, query_subject
from pamledger_client.client import MemoryClient, PamspecError
from tests.conftest import ACTOR, PROVENANCE, Env, pamspec_dir, run_cli
from tests.integration.test_cli import error_of, run
from tests.integration.test_pamspec_conformance import validator

pytestmark = pytest.mark.profile("PAMSPEC-Evaluation")  # partially built, not claimed (docs/implementation-report.md)

SCOPE = "workspace:snapshots"
OTHER = "workspace:snapshots-other"
SCHEMA = "evaluation-snapshot.schema.json"
# Every lifecycle and validation state (the default is the trusted target: active and corroborated only).
WIDE: dict[str, Any] = {"lifecycle_states": ["scratch", "candidate", "active", "superseded", "deprecated", "archived"],
        "validation_states": ["unverified", "corroborated", "disputed", "rejected"]}


def schema_errors(instance: Any) -> list[str]:
    """Errors of `instance` against the official evaluation-snapshot schema (read from ../shared)."""
    return [e.message for e in validator(SCHEMA).iter_errors(instance)]


async def raw(client: MemoryClient, name: str, body: dict[str, Any]) -> bytes:
    """A query's reply bytes exactly as the service sent them."""
    reply = await client.nc.request(query_subject(client.prefix, name), msgspec.json.encode(body), timeout=10)
    return reply.data


async def answers(client: MemoryClient, snapshot_id: str, objects: list[str]) -> dict[str, bytes]:
    """Every answer at the snapshot this test compares: read and history of each object, and two queries."""
    found = {}
    for object_id in objects:
        for name in ("read", "history"):
            found[f"{name}:{object_id}"] = await raw(client, name, {"scope_id": SCOPE, "object_id": object_id,
                                                                     "snapshot_id": snapshot_id})
    found["query"] = await raw(client, "query", {"scope_id": SCOPE, "snapshot_id": snapshot_id, **WIDE})
    found["query:text"] = await raw(client, "query", {"scope_id": SCOPE, "snapshot_id": snapshot_id, **WIDE,
                                                      "text": "cats", "order": "score"})
    return found


async def claim(client: MemoryClient, text: str, scope: str = SCOPE) -> dict[str, Any]:
    return await client.create(scope, "claim", {"statement": text}, ACTOR, PROVENANCE)


@pytest.fixture(scope="module")
async def made(client: MemoryClient) -> dict[str, Any]:
    await client.create_scope(SCOPE)
    await client.create_scope(OTHER)
    objects = {name: await claim(client, text) for name, text in (
        ("cats", "cats chase mice"), ("dogs", "dogs chase cats"), ("rain", "rain falls on cats"))}
    objects["updated"] = await client.update(SCOPE, objects["dogs"]["object_id"], objects["dogs"]["version_id"],
                                             {"statement": "dogs chase cats, twice"}, ACTOR, PROVENANCE)
    return objects


async def test_a_sealed_snapshot_is_a_valid_descriptor_recorded_in_the_ledger(client: MemoryClient,
                                                                              made: dict[str, Any]) -> None:
    sealed = await client.snapshot_create(SCOPE, ACTOR, evaluation_run_id="eval:run:one",
                                          deterministic_clock={"clock_ref": "clock:eval:1",
                                                               "start_at": "2026-07-17T00:00:00Z", "tick_ms": 1},
                                          deterministic_rng_seed=1729)
    descriptor = sealed["snapshot"]
    assert schema_errors(descriptor) == []
    assert descriptor["sealed"] is True and descriptor["scope_id"] == SCOPE
    assert descriptor["ledger_sequence_high_watermark"] == sealed["ledger_sequence"] - 1  # the head it was sealed at
    assert "included_object_ids" not in descriptor  # every object of the scope (the schema's absent)
    assert descriptor["digest"].startswith("sha256:") and descriptor["created_by_actor_id"] == ACTOR["actor_id"]
    shown = await client.snapshot_show(SCOPE, descriptor["snapshot_id"])
    assert shown["snapshot"] == descriptor
    listed = await client.snapshot_list(SCOPE)
    assert descriptor in [s["snapshot"] for s in listed["snapshots"]]
    entries = await client.events(SCOPE, after_sequence=sealed["ledger_sequence"] - 1, limit=1)
    entry = entries["events"][0]["event"]
    assert entry["event_type"] == "index_rebuilt"
    assert entry["payload"] == {"action": "snapshot_sealed", "snapshot": descriptor}


async def test_answers_at_a_snapshot_are_the_same_bytes_after_later_writes(client: MemoryClient,
                                                                           made: dict[str, Any]) -> None:
    members = [made[k]["object_id"] for k in ("cats", "dogs", "rain")]
    sealed = await client.snapshot_create(SCOPE, ACTOR)
    sid = sealed["snapshot"]["snapshot_id"]
    before = await answers(client, sid, members)
    query = json.loads(before["query"])["result"]
    assert sorted(i["envelope"]["object_id"] for i in query["items"]) == sorted(members)
    assert query["snapshot"] == {"snapshot_id": sid, "erased_since_seal": 0,
                                 "ledger_sequence_high_watermark": sealed["snapshot"]["ledger_sequence_high_watermark"]}
    read = json.loads(before[f"read:{made['dogs']['object_id']}"])["result"]
    assert read["envelope"]["canonical_content"] == {"statement": "dogs chase cats, twice"}

    cats = made["cats"]
    await client.update(SCOPE, cats["object_id"], cats["version_id"], {"statement": "cats sleep"}, ACTOR, PROVENANCE)
    rain = await client.read(SCOPE, made["rain"]["object_id"])
    await client.transition(SCOPE, rain["object_id"], rain["version_id"], "lifecycle", "archived", ACTOR, PROVENANCE)
    await claim(client, "cats everywhere, created after the seal")
    await client.snapshot_create(SCOPE, ACTOR)  # another snapshot changes nothing of this one

    assert await answers(client, sid, members) == before
    live = await client.query(SCOPE, **WIDE)
    assert len(live["items"]) == 4  # the live scope did move: one more claim  # the live scope did move


async def test_a_snapshot_of_named_objects_answers_only_those(client: MemoryClient, made: dict[str, Any]) -> None:
    cats, dogs = made["cats"]["object_id"], made["dogs"]["object_id"]
    sealed = await client.snapshot_create(SCOPE, ACTOR, object_ids=[cats])
    sid = sealed["snapshot"]["snapshot_id"]
    assert sealed["snapshot"]["included_object_ids"] == [cats]
    found = await client.query(SCOPE, snapshot_id=sid, **WIDE)
    assert [i["envelope"]["object_id"] for i in found["items"]] == [cats]
    with pytest.raises(PamspecError) as caught:
        await client.read(SCOPE, dogs, snapshot_id=sid)
    assert caught.value.code == "object_not_found"


async def test_named_members_the_scope_did_not_hold_at_the_watermark_are_refused(client: MemoryClient,
                                                                                  made: dict[str, Any]) -> None:
    cats, late = made["cats"], await claim(client, "made after the watermark")
    for members, at in (([cats["object_id"], "mem:never"], None), ([cats["object_id"], late["object_id"]],
                                                                     late["ledger_sequence"] - 1)):
        with pytest.raises(PamspecError) as caught:
            await client.snapshot_create(SCOPE, ACTOR, object_ids=members, at=at)
        assert caught.value.code == "object_not_found" and caught.value.details["object_ids"] == members[1:]
    with pytest.raises(PamspecError) as caught:  # another scope's object is not this scope's
        await client.snapshot_create(OTHER, ACTOR, object_ids=[cats["object_id"]])
    assert caught.value.code == "object_not_found"


async def test_a_snapshot_at_an_earlier_sequence_answers_as_the_scope_stood_then(client: MemoryClient,
                                                                                  made: dict[str, Any]) -> None:
    dogs = made["dogs"]
    sealed = await client.snapshot_create(SCOPE, ACTOR, at=dogs["ledger_sequence"])  # before its update
    read = await client.read(SCOPE, dogs["object_id"], snapshot_id=sealed["snapshot"]["snapshot_id"])
    assert read["envelope"]["canonical_content"] == {"statement": "dogs chase cats"}
    history = await client.history(SCOPE, dogs["object_id"], snapshot_id=sealed["snapshot"]["snapshot_id"])
    assert [v["sequence"] for v in history["versions"]] == [1]
    assert all(e["ledger_sequence"] <= dogs["ledger_sequence"] for e in history["events"])


async def test_erasure_after_the_seal_wins_and_the_snapshot_says_how_much_it_lost(client: MemoryClient,
                                                                                  made: dict[str, Any]) -> None:
    victim = await claim(client, "a secret to forget")
    kept = await claim(client, "a fact to keep")
    sealed = await client.snapshot_create(SCOPE, ACTOR, object_ids=[victim["object_id"], kept["object_id"]])
    sid = sealed["snapshot"]["snapshot_id"]
    before = await client.read(SCOPE, victim["object_id"], snapshot_id=sid)
    assert before["envelope"]["canonical_content"] == {"statement": "a secret to forget"}
    await client.delete(SCOPE, victim["object_id"], victim["version_id"], ACTOR, PROVENANCE)
    after = await client.read(SCOPE, victim["object_id"], snapshot_id=sid)
    assert after["envelope"].get("canonical_content") is None
    assert after["snapshot"]["erased_since_seal"] == 1
    found = await raw(client, "query", {"scope_id": SCOPE, "snapshot_id": sid, **WIDE})
    assert len(json.loads(found)["result"]["items"]) == 2
    assert b"a secret to forget" not in found
    assert json.loads(found)["result"]["snapshot"]["erased_since_seal"] == 1
    history = await raw(client, "history", {"scope_id": SCOPE, "object_id": victim["object_id"], "snapshot_id": sid})
    assert b"a secret to forget" not in history
    kept_read = await client.read(SCOPE, kept["object_id"], snapshot_id=sid)
    assert kept_read["envelope"]["canonical_content"] == {"statement": "a fact to keep"}


async def test_content_a_redaction_suppresses_after_the_seal_is_hidden_at_the_snapshot_too(
        client: MemoryClient, made: dict[str, Any]) -> None:
    """Suppressed content stays in storage (a restoration may bring it back) but no answer shows it."""
    hushed = await claim(client, "a suppressed remark")
    sealed = await client.snapshot_create(SCOPE, ACTOR, object_ids=[hushed["object_id"]])
    sid = sealed["snapshot"]["snapshot_id"]
    await client.redact(SCOPE, hushed["object_id"], hushed["version_id"], ACTOR, PROVENANCE, "policy:test",
                        erase=False)
    found = await client.read(SCOPE, hushed["object_id"], snapshot_id=sid)
    assert found["envelope"].get("canonical_content") is None and found["snapshot"]["erased_since_seal"] == 1
    for name, body in (("history", {"object_id": hushed["object_id"]}), ("query", WIDE)):
        reply = await raw(client, name, {"scope_id": SCOPE, "snapshot_id": sid, **body})
        assert b"a suppressed remark" not in reply and b'"erased_since_seal":1' in reply, reply


async def test_a_sealed_snapshot_id_is_frozen(client: MemoryClient, made: dict[str, Any]) -> None:
    sealed = await client.snapshot_create(SCOPE, ACTOR, object_ids=[made["cats"]["object_id"]])
    sid = sealed["snapshot"]["snapshot_id"]
    for scope, members in ((SCOPE, [made["cats"]["object_id"], made["dogs"]["object_id"]]), (OTHER, None)):
        with pytest.raises(PamspecError) as caught:
            await client.snapshot_create(scope, ACTOR, object_ids=members, snapshot_id=sid)
        assert caught.value.code == "invalid_state_transition"
        assert caught.value.details["rule"] == "evaluation_snapshot_membership_frozen"
    assert (await client.snapshot_show(SCOPE, sid))["snapshot"] == sealed["snapshot"]


async def test_a_retry_with_the_idempotency_key_replays_the_seal_and_the_sdk_still_returns_the_descriptor(
        client: MemoryClient, made: dict[str, Any]) -> None:
    body = {"scope_id": SCOPE, "actor": ACTOR, "snapshot": {"snapshot_id": "snap:retried"},
            "idempotency_key": "k:snap:retried"}
    first = await client.command("snapshot_create", body)
    replayed = await client.command("snapshot_create", body)
    assert replayed["idempotency_result"] == "replayed_original_result"
    assert replayed["ledger_sequence"] == first["ledger_sequence"] and "snapshot" not in replayed
    again = await client.snapshot_create(SCOPE, ACTOR, snapshot_id="snap:retried", idempotency_key="k:snap:retried")
    assert again["snapshot"] == first["snapshot"] and again["ledger_sequence"] == first["ledger_sequence"]


async def test_unknown_snapshots_and_bad_requests_are_refused_with_their_codes(client: MemoryClient,
                                                                               made: dict[str, Any]) -> None:
    object_id = made["cats"]["object_id"]
    for call in (client.read(SCOPE, object_id, snapshot_id="snap:never"),
                 client.history(SCOPE, object_id, snapshot_id="snap:never"),
                 client.query(SCOPE, snapshot_id="snap:never"),
                 client.snapshot_show(SCOPE, "snap:never")):
        with pytest.raises(PamspecError) as caught:
            await call
        assert caught.value.code == "snapshot_not_found"
    sealed = await client.snapshot_create(SCOPE, ACTOR)
    with pytest.raises(PamspecError) as caught:  # another scope's snapshot is not found there
        await client.query(OTHER, snapshot_id=sealed["snapshot"]["snapshot_id"])
    assert caught.value.code == "snapshot_not_found"
    head = sealed["ledger_sequence"]
    for at in (head + 100, -1):
        with pytest.raises(PamspecError) as caught:
            await client.snapshot_create(SCOPE, ACTOR, at=at)
        assert caught.value.code == "invalid_request", at
    for bad in ({"sealed": False}, {"unknown_field": 1}):
        with pytest.raises(PamspecError) as caught:
            await client.snapshot_create(SCOPE, ACTOR, **bad)
        assert caught.value.code == "invalid_object", bad
    with pytest.raises(PamspecError) as caught:
        await client.snapshot_create("workspace:no-such-scope", ACTOR)
    assert caught.value.code == "scope_not_found"


async def test_the_unsealed_vector_is_refused_as_an_invalid_object(client: MemoryClient, made: dict[str, Any]) -> None:
    vector = json.loads((pamspec_dir() / "test-vectors" / "invalid" / "evaluation-snapshot-unsealed.json").read_text())
    instance = {**vector["instance"], "scope_id": SCOPE}
    reply = await client.nc.request(command_subject(client.prefix, "snapshot_create"), msgspec.json.encode(
        {"scope_id": SCOPE, "actor": ACTOR, "snapshot": instance}), timeout=10)
    assert json.loads(reply.data)["error"]["code"] == vector["expected_failure"]


async def test_the_cli_seals_lists_shows_and_reads_at_a_snapshot(service: Env, client: MemoryClient,
                                                                 made: dict[str, Any], tmp_path: Path) -> None:
    cats = made["cats"]["object_id"]
    code, sealed, err = await run(service, tmp_path, "snapshot", "create", SCOPE, "--objects", cats,
                                  "--id", "snap:cli:1", "--evaluation-run-id", "eval:run:cli")
    assert code == 0, err
    assert schema_errors(sealed) == [] and sealed["included_object_ids"] == [cats]
    code, shown, err = await run(service, tmp_path, "snapshot", "show", SCOPE, "snap:cli:1")
    assert code == 0 and shown["snapshot"] == sealed, err
    code, listed, err = await run(service, tmp_path, "snapshot", "list", SCOPE)
    assert code == 0 and sealed in [s["snapshot"] for s in listed["snapshots"]], err
    for args in (("read", SCOPE, cats), ("history", SCOPE, cats)):
        code, found, err = await run(service, tmp_path, *args, "--snapshot", "snap:cli:1")
        assert code == 0 and found["snapshot"]["snapshot_id"] == "snap:cli:1", err
    code, found, err = await run(service, tmp_path, "query", SCOPE, "--snapshot", "snap:cli:1",
                                 "--validation", "unverified", "--lifecycle", "active", "--lifecycle", "candidate")
    assert code == 0 and [i["envelope"]["object_id"] for i in found["items"]] == [cats], err
    code, _, err = await run(service, tmp_path, "snapshot", "create", SCOPE, "--id", "snap:cli:1")
    assert code != 0 and error_of(err)["code"] == "invalid_state_transition"
    code, _, err = await run(service, tmp_path, "read", SCOPE, cats, "--snapshot", "snap:cli:none")
    assert code != 0 and error_of(err)["code"] == "snapshot_not_found"



async def test_verify_checks_the_snapshot_rows_against_their_ledger_entries(service: Env, client: MemoryClient,
                                                                             made: dict[str, Any]) -> None:
    """The snapshot_sealed entries are ledger rows like any other, and each evaluation_snapshots row must be its
    entry's descriptor: `pamledger verify` names a row that is not, or an entry without its row. The rows
    themselves refuse any change. Runs last: it tampers with this module's database."""
    from command_handler.verify import verify_tables

    sealed = await client.snapshot_create(SCOPE, ACTOR)
    done = await asyncio.to_thread(run_cli, service, "verify")
    assert done.returncode == 0 and json.loads(done.stdout)["ok"] is True, done.stdout + done.stderr
    url, sid = service.database_url, sealed["snapshot"]["snapshot_id"]
    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
        for change in ("UPDATE evaluation_snapshots SET scope_id = 'workspace:x' WHERE snapshot_id = %s",
                       "DELETE FROM evaluation_snapshots WHERE snapshot_id = %s"):
            with pytest.raises(psycopg.errors.InsufficientPrivilege):
                await conn.execute(change, (sid,))
        await conn.execute("INSERT INTO evaluation_snapshots (snapshot_id, scope_id, ledger_sequence, descriptor)"
                           " VALUES ('snap:forged', %s, %s, '{}')", (SCOPE, made["cats"]["ledger_sequence"]))
        report = await asyncio.to_thread(verify_tables, url)
        assert report["ok"] is False and report["check"] == "evaluation_snapshots.ledger_entry", report
        assert "snap:forged" in report["reason"]
        await conn.execute("ALTER TABLE evaluation_snapshots DISABLE TRIGGER USER")
        await conn.execute("DELETE FROM evaluation_snapshots WHERE snapshot_id IN ('snap:forged', %s)", (sid,))
        report = await asyncio.to_thread(verify_tables, url)
        assert report["ok"] is False and report["check"] == "evaluation_snapshots.row", report
        assert report["first_bad_sequence"] == sealed["ledger_sequence"]
