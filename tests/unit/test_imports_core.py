"""The writer's import of a bundle's entries (command_handler.core.imports), through plan_batch and an
InMemoryLedgerStore: a replayed erasure erases what the import stored, and two first chunks planned in one
batch cannot both claim one empty scope. No servers: the entries are made by the writer's own core."""

from __future__ import annotations

from typing import Any

import pytest

from command_handler.core.planner import PlanInputs, plan_batch
from command_handler.core.state import ImportFacts
from command_handler.memory_store import InMemoryLedgerStore
from schemas.bundle import chunk_key, remap_envelope, remap_event
from schemas.canonical import decode_json
from schemas.registry import default_registry
from tests.ledger_store_contract import SCOPE, Stamps, command, create, delete, scope
from tests.unit.test_writer_core_fast import Shell, result

DIGEST = "sha256:" + "ab" * 32
OTHER_DIGEST = "sha256:" + "cd" * 32


async def _source_entries() -> list[dict[str, Any]]:
    """A created object (its content shown, as a forged bundle would show it) and its deletion."""
    store = InMemoryLedgerStore()
    shell = Shell(store)
    await shell.send(scope(SCOPE))
    [made] = await shell.send(create("mem:gone", text="kept after an erasure?"))
    salt, content = next((row.salt, row.content) for row in store.content.values())
    await shell.send(delete("mem:gone", result(made)["version_id"]))
    entries = []
    for seq in sorted(store.ledger):
        event = decode_json(store.ledger[seq].event)
        row = next(v for v in store.versions.values() if v.ledger_sequence == seq)
        envelope = {**decode_json(row.meta), "canonical_content": decode_json(content)
                    if event["event_type"] == "object_created" else {"tombstone": True}}
        entry = {"event": event, "envelope": envelope}
        if event["event_type"] == "object_created":
            entry["salt"] = salt.hex()
        entries.append(entry)
    return entries


def _chunk(entries: list[dict[str, Any]], scope_id: str, digest: str = DIGEST) -> Any:
    """The first and last chunk importing `entries` into `scope_id` (remapped there, as the client does)."""
    entries = [{**e, "event": remap_event(e["event"], {SCOPE: scope_id}),
                "envelope": remap_envelope(e["envelope"], {SCOPE: scope_id})} for e in entries]
    return command("import_entries", scope_id=scope_id, bundle_digest=digest, source_ledger_id="ledger:source",
                   source_scope_id=SCOPE, chunk=0, entries=entries, final=True)


def _inputs(*chunks: Any) -> PlanInputs:
    stamps = Stamps()
    stamps.n = 1000  # the target's own ids (the import record's) come after the source's
    return PlanInputs(heads={}, idempotency={}, scope_known=lambda s: False, stamp=stamps, tail=(0, b"\0" * 32),
                      registry=default_registry(),
                      imports={(c.scope_id, chunk_key(c.command.bundle_digest, 0)): ImportFacts() for c in chunks})


async def test_a_replayed_erasure_erases_the_content_the_import_stored_before_it() -> None:
    entries = await _source_entries()
    item = _chunk(entries, "workspace:imported")
    plan = plan_batch([item], _inputs(item))
    assert plan.outcomes[0].error is None, plan.outcomes[0].error
    target = InMemoryLedgerStore()
    await target.append(plan.batch)
    assert [c.object_id for c in plan.batch.content] == ["mem:gone"]  # the forged bundle did carry it
    assert target.content == {}  # and the replayed deletion erased it, as a deletion here would have


async def test_two_first_chunks_in_one_batch_cannot_share_an_empty_scope() -> None:
    entries = await _source_entries()
    first, second = _chunk(entries[:1], "workspace:x"), _chunk(entries[:1], "workspace:x", OTHER_DIGEST)
    plan = plan_batch([first, second], _inputs(first, second))
    assert plan.outcomes[0].error is None
    error = plan.outcomes[1].error
    assert error is not None and error.details["rule"] == "import.scope_not_empty"
    assert len(plan.batch.scopes) == 1


@pytest.mark.parametrize("field", ["event", "envelope"])
async def test_an_entry_that_does_not_encode_back_to_its_bytes_is_refused(field: str) -> None:
    entries = await _source_entries()
    entries[0][field] = {**entries[0][field], "smuggled": "field"}
    item = _chunk(entries, "workspace:y")
    plan = plan_batch([item], _inputs(item))
    error = plan.outcomes[0].error
    assert error is not None and error.code == "invalid_request" and not plan.batch.ledger and not plan.batch.scopes


SPACE_ID, SPACE_DIGEST = "space:test:a", "sha256:" + "0a" * 32


def _with_vectors(entry: dict[str, Any], *spaces: tuple[str, str]) -> dict[str, Any]:
    return {**entry, "vectors": [{"embedding_space_id": s, "space_digest": d, "vector": [0.5, -0.25, 1e-3]}
                                 for s, d in spaces]}


def _planned(entries: list[dict[str, Any]], spaces: dict[str, str]) -> Any:
    item = _chunk(entries, "workspace:vectors")
    inputs = _inputs(item)
    inputs.imports = {key: ImportFacts(spaces=spaces) for key in inputs.imports}
    plan = plan_batch([item], inputs)
    assert plan.outcomes[0].error is None, plan.outcomes[0].error
    return plan


async def test_vectors_of_a_space_registered_with_the_same_digest_are_handed_to_the_indexer() -> None:
    entries = await _source_entries()
    entry = _with_vectors(entries[0], (SPACE_ID, SPACE_DIGEST), ("space:test:b", SPACE_DIGEST),
                          ("space:test:unknown", SPACE_DIGEST))
    plan = _planned([entry], {SPACE_ID: SPACE_DIGEST, "space:test:b": "sha256:" + "0b" * 32})
    [row] = plan.batch.handoff  # space b is registered here with another descriptor: not the same space
    assert (row.scope_id, row.object_id, row.embedding_space_id, row.space_digest) == (
        "workspace:vectors", "mem:gone", SPACE_ID, SPACE_DIGEST)
    assert row.version_id == entries[0]["event"]["version_id"] and row.version_sequence == 1
    assert row.content_digest == entries[0]["event"]["payload"]["content_digest"]
    assert row.vector == (0.5, -0.25, 1e-3)
    accepted = plan.outcomes[0].accepted
    assert accepted is not None and accepted.decision.result == {"vectors_handed_over": 1, "vectors_left": 2}
    target = InMemoryLedgerStore()
    await target.append(plan.batch)
    assert target.handoff == [row]


async def test_a_version_whose_content_the_bundle_does_not_show_hands_no_vector_over() -> None:
    entries = await _source_entries()
    hidden = {k: v for k, v in _with_vectors(entries[0], (SPACE_ID, SPACE_DIGEST)).items() if k != "salt"}
    plan = _planned([hidden], {SPACE_ID: SPACE_DIGEST})
    assert plan.batch.handoff == []
    accepted = plan.outcomes[0].accepted
    assert accepted is not None and accepted.decision.result == {"vectors_handed_over": 0, "vectors_left": 1}
    deleted = _planned([entries[0], _with_vectors(entries[1], (SPACE_ID, SPACE_DIGEST))], {SPACE_ID: SPACE_DIGEST})
    assert deleted.batch.handoff == []  # a deletion's tombstone shows no content


async def test_an_import_without_vectors_says_nothing_of_them() -> None:
    entries = await _source_entries()
    plan = _planned(entries[:1], {SPACE_ID: SPACE_DIGEST})
    accepted = plan.outcomes[0].accepted
    assert accepted is not None and accepted.decision.result is None and plan.batch.handoff == []
