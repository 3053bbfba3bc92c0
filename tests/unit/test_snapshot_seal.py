"""Sealing evaluation snapshots in the writer's core and planner: the descriptor, the watermark's bounds, frozen
ids (before the batch and within it), and descriptors a client gets wrong."""

from __future__ import annotations

from typing import Any

import msgspec
import pytest

from command_handler.core.intake import Parsed, parse
from command_handler.core.planner import Plan, PlanInputs, plan_batch
from schemas.canonical import decode_json
from schemas.errors import PamledgerError
from schemas.snapshots import snapshot_digest
from tests.unit.test_plan_batch import ACTOR, REGISTRY, SCOPE, TAIL, codes, create, numbered_stamps


def seal(snapshot: dict[str, Any], scope: str = SCOPE) -> Parsed:
    body = {"scope_id": scope, "actor": ACTOR, "snapshot": snapshot}
    return parse("snapshot_create", msgspec.json.encode(body), {}, 1 << 20)


def plan(items: list[Parsed | PamledgerError], sealed: frozenset[str] = frozenset(),
         born: dict[tuple[str, str], int] | None = None) -> Plan:
    return plan_batch(items, PlanInputs(heads={}, idempotency={}, scope_known={SCOPE}.__contains__,
                                        stamp=numbered_stamps(), tail=TAIL, registry=REGISTRY, sealed=sealed,
                                        born=born or {}))


def sealed_descriptor(result: Plan, index: int = 0) -> dict[str, Any]:
    accepted = result.outcomes[index].accepted
    assert accepted is not None and accepted.decision.result is not None
    return accepted.decision.result["snapshot"]  # type: ignore[no-any-return]


def test_a_snapshot_is_sealed_at_the_head_it_is_decided_at() -> None:
    result = plan([create("mem:a"), seal({"snapshot_id": "snap:1"})])
    descriptor = sealed_descriptor(result, 1)
    assert descriptor["ledger_sequence_high_watermark"] == TAIL[0] + 1  # the create before it, same batch
    assert descriptor["sealed"] is True and descriptor["scope_id"] == SCOPE
    assert descriptor["created_at"] == "2026-11-29T12:00:00.000000Z"
    assert descriptor["created_by_actor_id"] == ACTOR["actor_id"]
    assert descriptor["digest"] == snapshot_digest(descriptor) and descriptor["digest_algorithm"] == "sha-256"
    row = result.batch.ledger[1]
    assert (row.event_type, row.object_id, row.version_id) == ("index_rebuilt", None, None)
    assert decode_json(row.event)["payload"] == {"action": "snapshot_sealed", "snapshot": descriptor}
    assert [(r.snapshot_id, r.scope_id, r.ledger_sequence) for r in result.batch.snapshots] == [
        ("snap:1", SCOPE, TAIL[0] + 2)]
    assert result.batch.versions[1:] == []  # no Memory Version


def test_what_a_client_sends_in_the_writers_fields_is_replaced_by_what_it_seals() -> None:
    result = plan([create("mem:a"), seal({
                         "snapshot_id": "snap:1", "created_at": "2020-01-01T00:00:00Z", "digest": "sha256:x",
                         "created_by_actor_id": "actor:someone:else", "included_object_ids": ["mem:a"],
                         "evaluation_run_id": "eval:run:1", "deterministic_rng_seed": 7,
                         "deterministic_clock": {"clock_ref": "clock:1", "start_at": "2026-07-17T00:00:00Z"}})])
    descriptor = sealed_descriptor(result, 1)
    assert descriptor["created_at"] == "2026-11-29T12:00:00.000000Z"
    assert descriptor["created_by_actor_id"] == ACTOR["actor_id"]
    assert descriptor["digest"] == snapshot_digest(descriptor)
    assert descriptor["included_object_ids"] == ["mem:a"] and descriptor["evaluation_run_id"] == "eval:run:1"
    assert descriptor["deterministic_clock"] == {"clock_ref": "clock:1", "start_at": "2026-07-17T00:00:00.000000Z"}


@pytest.mark.parametrize("at, code", [(0, None), (TAIL[0], None), (TAIL[0] + 1, "invalid_request"),
                                      (-1, "invalid_request")])
def test_the_watermark_is_between_zero_and_the_head(at: int, code: str | None) -> None:
    assert codes(plan([seal({"snapshot_id": "snap:1", "ledger_sequence_high_watermark": at})])) == [code]


def test_a_sealed_id_is_frozen_before_the_batch_and_within_it() -> None:
    result = plan([seal({"snapshot_id": "snap:old"}), seal({"snapshot_id": "snap:new"}),
                   seal({"snapshot_id": "snap:new", "included_object_ids": ["mem:a"]})], sealed=frozenset({"snap:old"}))
    assert codes(result) == ["invalid_state_transition", None, "invalid_state_transition"]
    frozen = result.outcomes[2].error
    assert frozen is not None and frozen.details["rule"] == "evaluation_snapshot_membership_frozen"
    assert [r.snapshot_id for r in result.batch.snapshots] == ["snap:new"]


@pytest.mark.parametrize("snapshot", [{"snapshot_id": "snap:1", "sealed": False},
                                      {"snapshot_id": "snap:1", "colour": "red"},
                                      {"snapshot_id": "snap:1", "deterministic_clock": {"clock_ref": "c:1"}},
                                      {"snapshot_id": "not an id"}])
def test_a_descriptor_the_schema_refuses_is_an_invalid_object(snapshot: dict[str, Any]) -> None:
    with pytest.raises(PamledgerError) as caught:
        seal(snapshot)
    assert caught.value.code == "invalid_object"


def test_named_members_twice_or_another_scope_in_the_descriptor_are_refused() -> None:
    result = plan([seal({"snapshot_id": "snap:1", "included_object_ids": ["mem:a", "mem:a"]}),
                   seal({"snapshot_id": "snap:2", "scope_id": "workspace:elsewhere"})])
    assert codes(result) == ["invalid_request", "invalid_object"]


def test_a_snapshot_of_an_unknown_scope_is_scope_not_found() -> None:
    assert codes(plan([seal({"snapshot_id": "snap:1"}, scope="workspace:nowhere")])) == ["scope_not_found"]



def test_named_members_must_be_objects_the_scope_held_at_the_watermark() -> None:
    born = {(SCOPE, "mem:old"): 10, (SCOPE, "mem:late"): 30}
    result = plan([seal({"snapshot_id": "snap:1", "included_object_ids": ["mem:old"],
                         "ledger_sequence_high_watermark": 20}),
                   seal({"snapshot_id": "snap:2", "included_object_ids": ["mem:old", "mem:late", "mem:never"],
                         "ledger_sequence_high_watermark": 20}),
                   create("mem:new"),
                   seal({"snapshot_id": "snap:3", "included_object_ids": ["mem:old", "mem:late", "mem:new"]})],
                  born=born)
    assert codes(result) == [None, "object_not_found", None, None]  # mem:new: created earlier in this batch
    refused = result.outcomes[1].error
    assert refused is not None and refused.details["object_ids"] == ["mem:late", "mem:never"]
    assert refused.details["missing"] == 2
    assert sealed_descriptor(result, 3)["ledger_sequence_high_watermark"] == TAIL[0] + 2
