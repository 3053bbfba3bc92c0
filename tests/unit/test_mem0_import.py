"""A Mem0 export becomes the commands docs/mem0.md says, and a malformed one is refused whole, naming the memory.

Why pure: the import plans the whole file before it writes anything, so every refusal is a property of the
plan (tests/integration/test_mem0_import.py sends the plan to the real service).
"""

from __future__ import annotations

import copy
from typing import Any

import pytest

from pamledger.mem0_import import (
    MAX_TEXT_CHARS,
    Mem0ExportRefused,
    Mem0Options,
    MemoryPlan,
    decode_export,
    plan_import,
)
from tests.fixtures.mem0_export import EXPORT, GONE, HIKING, MOVED, SEAT, STEPS

ACTOR = {"actor_id": "actor:human:importer", "actor_kind": "human"}
OPTIONS = Mem0Options(scope="workspace:mem0", actor=ACTOR, user_scope_prefix="user:")


def memories(export: Any = EXPORT, options: Mem0Options = OPTIONS) -> dict[str, MemoryPlan]:
    return {m.memory_id: m for m in plan_import(export, options).memories}


def refusal(export: Any, options: Mem0Options = OPTIONS) -> Mem0ExportRefused:
    with pytest.raises(Mem0ExportRefused) as caught:
        plan_import(export, options)
    return caught.value


def test_the_fixture_plans_one_object_per_memory_with_a_version_per_history_entry() -> None:
    plan = plan_import(EXPORT, OPTIONS)
    assert plan.shape == "get_all results with history"
    assert plan.scopes == ("user:alice", "user:bob", "workspace:mem0")
    found = {m.memory_id: [s.command for s in m.steps] for m in plan.memories}
    assert found == {HIKING: ["create", "update"], SEAT: ["create"], STEPS: ["create"],
                     MOVED: ["create", "update"], GONE: ["create", "delete"]}
    assert plan.versions == 8


def test_ids_and_idempotency_keys_come_from_the_mem0_ids() -> None:
    hiking = memories()[HIKING]
    assert hiking.object_id == f"mem:mem0:{HIKING}"
    assert [s.body["idempotency_key"] for s in hiking.steps] == [f"mem0:{HIKING}:1", f"mem0:{HIKING}:2"]
    assert [s.body["provenance"]["provenance_id"] for s in hiking.steps] == [
        f"prov:mem0:{HIKING}:1", f"prov:mem0:{HIKING}:2"]
    assert all("expected_version_id" not in s.body for s in hiking.steps)  # the previous step's result gives it


def test_versions_carry_the_history_texts_and_the_mem0_times_as_observed_and_asserted() -> None:
    create, update = memories()[HIKING].steps
    assert create.body["canonical_content"]["statement"] == "Likes hiking"
    assert update.body["canonical_content"]["statement"] == "Likes hiking and climbing"
    assert (create.body["observed_at"], create.body["asserted_at"]) == ("2025-03-01T09:00:00.120000-08:00",) * 2
    assert update.body["observed_at"] == update.body["provenance"]["observed_at"] == "2025-03-08T18:30:00.500000-08:00"
    for step in (create, update):  # the service assigns commit and record times; an import never names them
        assert not {"committed_at", "recorded_at"} & (set(step.body) | set(step.body["provenance"]))


def test_provenance_names_mem0_the_memory_and_its_user_agent_run_ids() -> None:
    seat = memories()[SEAT].steps[0].body["provenance"]
    assert seat["source_ref"] == f"mem0:memory:{SEAT}"
    assert seat["activity"] == "mem0:current" and seat["actor"] == ACTOR
    assert seat["evidence_refs"] == ["mem0:agent_id=travel-agent", "mem0:user_id=alice"]
    update = memories()[HIKING].steps[1].body["provenance"]
    assert update["activity"] == "mem0:update" and "mem0:history_id=h-0002" in update["evidence_refs"]


def test_the_mem0_fields_and_metadata_are_kept_in_the_content_of_the_current_version() -> None:
    hiking = memories()[HIKING].steps
    current = hiking[-1].body["canonical_content"]["mem0"]
    assert current["metadata"] == {"category": "hobbies", "confidence": "high"}
    assert (current["hash"], current["categories"], current["user_id"]) == ("5f1c0e8e2a", ["hobbies"], "alice")
    assert current["history_entry"]["id"] == "h-0002"
    first = hiking[0].body["canonical_content"]["mem0"]
    assert "metadata" not in first and first["history_entry"]["event"] == "ADD"  # history rows carry none


def test_a_listing_that_moved_past_its_history_adds_a_current_version() -> None:
    create, current = memories()[MOVED].steps
    assert create.body["canonical_content"]["statement"] == "Lives in Porto"
    assert current.body["canonical_content"]["statement"] == "Lives in Lisbon"
    assert current.body["provenance"]["activity"] == "mem0:current"
    assert current.body["observed_at"] == "2025-05-01T10:00:00-07:00"  # its updated_at


def test_a_deleted_memory_ends_in_a_delete_tombstone_in_the_scope_of_its_user() -> None:
    gone = memories()[GONE]
    assert gone.scope_id == "user:bob"
    assert gone.steps[-1].command == "delete" and "canonical_content" not in gone.steps[-1].body


def test_memories_are_claims_except_procedural_ones_or_what_metadata_names() -> None:
    kinds = {k: m.steps[0].body["object_type"] for k, m in memories().items()}
    assert kinds == {HIKING: "claim", SEAT: "claim", STEPS: "observation", MOVED: "claim", GONE: "claim"}
    assert memories()[STEPS].steps[0].body["canonical_content"]["text"].startswith("Booked")
    export = copy.deepcopy(EXPORT)
    export["results"][1]["metadata"]["pamspec_object_type"] = "observation"
    assert memories(export)[SEAT].steps[0].body["object_type"] == "observation"
    all_observations = Mem0Options(scope="workspace:mem0", actor=ACTOR, object_type="observation")
    assert memories(options=all_observations)[HIKING].steps[0].body["object_type"] == "observation"


def test_scope_rules_apply_in_order_run_agent_user_prefix_default() -> None:
    options = Mem0Options(scope="workspace:mem0", actor=ACTOR, user_scope_prefix="user:",
                          map_user={"alice": "workspace:alice"}, map_agent={"travel-agent": "workspace:travel"},
                          map_run={"run-17": "workspace:run17"})
    scopes = {k: m.scope_id for k, m in memories(options=options).items()}
    assert scopes == {HIKING: "workspace:alice", SEAT: "workspace:travel", STEPS: "workspace:run17",
                      MOVED: "workspace:alice", GONE: "user:bob"}
    plain = Mem0Options(scope="workspace:mem0", actor=ACTOR)
    assert {m.scope_id for m in memories(options=plain).values()} == {"workspace:mem0"}


def test_the_same_export_plans_the_same_commands() -> None:
    assert plan_import(EXPORT, OPTIONS) == plan_import(copy.deepcopy(EXPORT), OPTIONS)


def test_a_bare_list_and_a_flat_history_list_are_accepted() -> None:
    listed = memories(EXPORT["results"])
    assert sorted(listed) == sorted([HIKING, SEAT, STEPS, MOVED]) and len(listed[HIKING].steps) == 1
    flat = {"results": EXPORT["results"], "history": [e for entries in EXPORT["history"].values() for e in entries]}
    assert memories(flat) == memories()


@pytest.mark.parametrize(("data", "reason"), [
    (b"{not json", "not a JSON"), (b'{"results": [NaN]}', "not a JSON"), (b'{"results": [1e999]}', "out of range"),
    (b'{"results": ["\\ud800"]}', "not a JSON"), (b"[" * 50_000 + b"]" * 50_000, "nests"), (b"\xff\xfe", "not a JSON"),
])
def test_a_file_that_is_not_json_is_refused(data: bytes, reason: str) -> None:
    with pytest.raises(Mem0ExportRefused) as caught:
        decode_export(data)
    assert reason in caught.value.message


def _with_memory(**fields: Any) -> dict[str, Any]:
    export = copy.deepcopy(EXPORT)
    export["results"][0].update(fields)
    return export


def _with_history(entries: list[Any]) -> dict[str, Any]:
    export = copy.deepcopy(EXPORT)
    export["history"][HIKING] = entries
    return export


ADD = {"id": "h-1", "memory_id": HIKING, "event": "ADD", "new_memory": "Likes hiking and climbing"}
DELETE = {"id": "h-2", "memory_id": HIKING, "event": "DELETE", "old_memory": "x", "new_memory": None}
REFUSED_MEMORIES = [
    pytest.param(_with_memory(memory=None), "memory is not a string", id="memory-not-a-string"),
    pytest.param(_with_memory(memory="x" * (MAX_TEXT_CHARS + 1)), "over the", id="huge-memory"),
    pytest.param(_with_memory(memory="a\x00b"), "NUL", id="nul-in-memory"),
    pytest.param(_with_memory(metadata={"k\x00": 1}), "NUL", id="nul-in-a-metadata-key"),
    pytest.param(_with_memory(metadata={"blob": "x" * 200_000}), "bytes, over", id="huge-metadata"),
    pytest.param(_with_memory(updated_at="last tuesday"), "not an ISO 8601", id="bad-time"),
    pytest.param(_with_memory(user_id=7), "user_id is not a string", id="user-id-not-a-string"),
    pytest.param(_with_memory(user_id="ana@example.com"), "--map-user", id="user-id-not-a-scope"),
    pytest.param(_with_history([{**ADD, "event": "UPDATE"}]), "must start with ADD", id="history-without-add"),
    pytest.param(_with_history([ADD, ADD]), "must start with ADD", id="history-with-two-adds"),
    pytest.param(_with_history([ADD, {**ADD, "event": "NONE"}]), "only ADD, UPDATE and DELETE", id="unknown-event"),
    pytest.param(_with_history([ADD, DELETE]), "ends with DELETE", id="listed-but-deleted"),
    pytest.param(_with_history([ADD, {**ADD, "memory_id": SEAT}]), "names memory_id", id="entry-of-another"),
    pytest.param(_with_history(["ADD"]), "not a JSON object", id="entry-not-an-object"),
]


@pytest.mark.parametrize(("export", "reason"), REFUSED_MEMORIES)
def test_a_memory_that_cannot_be_mapped_refuses_the_whole_file_naming_it(export: Any, reason: str) -> None:
    refused = refusal(export)
    assert reason in refused.message, refused.message
    assert HIKING in refused.message and refused.problems[0]["memory_id"] == HIKING
    assert "nothing was written" in refused.message


def test_every_bad_memory_is_listed_not_only_the_first() -> None:
    export = copy.deepcopy(EXPORT)
    export["results"][0]["memory"] = 1
    export["results"][1]["memory"] = "a\x00"
    assert {p["memory_id"] for p in refusal(export).problems} == {HIKING, SEAT}


@pytest.mark.parametrize(("export", "reason"), [
    ("a string", "top level is a JSON str"), ({"memories": []}, "no 'results'"),
    ({"results": [], "extra": 1}, "unknown top-level field"), ({"results": {}}, "'results' is not a list"),
    ({"results": [], "history": 3}, "'history' is neither"), ({"results": [], "history": [{"event": "ADD"}]},
                                                              "names no memory_id"),
    ({"results": [{"memory": "no id"}]}, "no string 'id'"), ({"results": [3]}, "is a JSON object"),
    ({"results": [{"id": "a b", "memory": "x"}]}, "PAMSPEC id cannot hold"),
    ({"results": [{"id": "a", "memory": "x"}, {"id": "a", "memory": "y"}]}, "listed twice"),
])
def test_a_shape_that_is_not_mem0s_is_refused_clearly(export: Any, reason: str) -> None:
    refused = refusal(export)
    assert reason in refused.message or reason in refused.problems[0]["reason"], refused.message


def test_a_page_of_a_paginated_listing_warns() -> None:
    plan = plan_import({"results": EXPORT["results"], "next": "https://api.mem0.ai/v2/memories/?page=2"}, OPTIONS)
    assert any("paginated" in w for w in plan.warnings)
