"""Evaluation runs in the writer's planner: eval_start forks a sealed snapshot into a new scope, the run's
commands take the run's clock and seeded ids (the same script twice gives the same rows), the run id reaches
every version's provenance and every entry's payload, and eval_end closes the scope to writes."""

from __future__ import annotations

from typing import Any

import msgspec

from command_handler.core.evaluation import EvaluationRun, forked_head
from command_handler.core.intake import Parsed, parse
from command_handler.core.planner import Plan, PlanInputs, plan_batch
from schemas.canonical import decode_json
from schemas.errors import PamledgerError
from tests.unit.test_plan_batch import ACTOR, PROV, REGISTRY, SCOPE, TAIL, codes, loaded, numbered_stamps

EVAL = "eval:run:1"
DESCRIPTOR = {"snapshot_id": "snap:1", "scope_id": SCOPE, "sealed": True, "ledger_sequence_high_watermark": 40,
              "digest": "sha256:d", "evaluation_run_id": "run:1", "deterministic_rng_seed": 42,
              "deterministic_clock": {"clock_ref": "clock:test", "start_at": "2026-01-01T00:00:00.000000Z",
                                      "tick_ms": 1000}}


def command(name: str, scope: str = EVAL, **body: Any) -> Parsed:
    return parse(name, msgspec.json.encode({"scope_id": scope, "actor": ACTOR, **body}), {}, 1 << 20)


def start(run_id: str | None = None, eval_scope: str = EVAL, snapshot_id: str = "snap:1") -> Parsed:
    body: dict[str, Any] = {"snapshot_id": snapshot_id, "evaluation_scope_id": eval_scope}
    if run_id is not None:
        body["evaluation_run_id"] = run_id
    return command("eval_start", SCOPE, **body)


def create(object_id: str | None = None, scope: str = EVAL) -> Parsed:
    body: dict[str, Any] = {"object_type": "claim", "canonical_content": {"statement": "x"}, "provenance": PROV,
                            "operation_id": f"op:script:{object_id}"}
    if object_id is not None:
        body["object_id"] = object_id
    return command("create", scope, **body)


def plan(items: list[Parsed | PamledgerError], runs: dict[str, EvaluationRun] | None = None,
         known: frozenset[str] = frozenset({SCOPE})) -> Plan:
    return plan_batch(items, PlanInputs(heads={}, idempotency={}, scope_known=known.__contains__,
                                        stamp=numbered_stamps(), tail=TAIL, registry=REGISTRY,
                                        runs=runs or {}, snapshots={"snap:1": DESCRIPTOR}))


def test_eval_start_creates_the_scope_and_records_the_fork_as_its_first_entry() -> None:
    result = plan([start()])
    assert codes(result) == [None]
    assert result.batch.scopes == [(EVAL, "evaluation", None, None)]
    row = result.batch.ledger[0]
    assert (row.scope_id, row.event_type) == (EVAL, "index_rebuilt")
    payload = decode_json(row.event)["payload"]
    assert payload["action"] == "evaluation_started" and payload["evaluation_run_id"] == "run:1"
    assert (payload["snapshot_id"], payload["base_scope_id"], payload["ledger_sequence_high_watermark"]) == (
        "snap:1", SCOPE, 40)
    assert payload["deterministic_rng_seed"] == 42
    assert decode_json(row.event)["recorded_at"] == "2026-01-01T00:00:00Z"  # the run's clock, index 0
    assert [(r.scope_id, r.evaluation_run_id) for r in result.batch.runs] == [(EVAL, "run:1")]
    assert result.runs[EVAL].run_id == "run:1"


def test_the_runs_commands_take_its_clock_and_seeded_ids_and_name_the_run() -> None:
    result = plan([start(), create("mem:a"), create()])
    assert codes(result) == [None, None, None]
    events = [decode_json(r.event) for r in result.batch.ledger]
    assert [e["recorded_at"] for e in events] == [
        "2026-01-01T00:00:00Z", "2026-01-01T00:00:01Z", "2026-01-01T00:00:02Z"]
    assert all(len(e["event_id"]) == 40 and e["payload"]["evaluation_run_id"] == "run:1" for e in events)
    assert events[2]["object_id"].startswith("mem:") and len(events[2]["object_id"]) == 40
    for version in result.batch.versions:
        meta = decode_json(version.meta)
        assert "evaluation_run:run:1" in meta["provenance"]["evidence_refs"]
        assert meta["committed_at"] == meta["recorded_at"]
    assert result.written[EVAL] == 3


def test_the_same_script_twice_gives_the_same_rows() -> None:
    script: list[Parsed | PamledgerError] = [start(), create("mem:a"), create()]
    one, two = plan(script), plan(script)
    assert [(r.event_id, r.event, r.row_hash) for r in one.batch.ledger] == \
        [(r.event_id, r.event, r.row_hash) for r in two.batch.ledger]
    assert [(c.content_digest, c.salt) for c in one.batch.content] == [(c.content_digest, c.salt)
                                                                      for c in two.batch.content]


def test_a_later_batch_counts_the_scopes_entries_so_far() -> None:
    first = plan([start(), create("mem:a")])
    run = msgspec.structs.replace(first.runs[EVAL], entries=first.written[EVAL])
    later = plan([create("mem:b")], runs={EVAL: run}, known=frozenset({SCOPE, EVAL}))
    assert decode_json(later.batch.ledger[0].event)["recorded_at"] == "2026-01-01T00:00:02Z"


def test_eval_end_closes_the_scope_to_writes() -> None:
    result = plan([start(), command("eval_end"), create("mem:late"), command("eval_end")])
    assert codes(result) == [None, None, "invalid_state_transition", "invalid_state_transition"]
    refused = result.outcomes[2].error
    assert refused is not None and refused.details["rule"] == "evaluation_run_ended"
    assert result.batch.runs[0].ended_sequence == TAIL[0] + 2
    assert result.runs[EVAL].ended


def test_eval_start_refuses_what_it_cannot_fork() -> None:
    result = plan([start(snapshot_id="snap:missing"), start(run_id="run:other"), start(eval_scope=SCOPE),
                   start(), start(eval_scope="eval:again"), start(eval_scope=EVAL)])
    assert codes(result) == ["snapshot_not_found", "invalid_request", "invalid_request", None,
                             "invalid_state_transition", "invalid_state_transition"]


def test_eval_end_outside_a_run_is_invalid_request() -> None:
    assert codes(plan([command("eval_end", SCOPE)])) == ["invalid_request"]


def test_a_snapshot_object_written_in_the_run_becomes_its_version_one_in_the_evaluation_scope() -> None:
    first = plan([start()])
    run = msgspec.structs.replace(first.runs[EVAL], entries=1)
    base = loaded("mem:base")[(SCOPE, "mem:base")]  # the snapshot's version: ver:old, sequence 1
    heads = {(EVAL, "mem:base"): forked_head(base, run)}
    update = command("update", object_id="mem:base", expected_version_id="ver:old",
                     canonical_content={"statement": "changed"}, provenance=PROV)
    result = plan_batch([update], PlanInputs(heads=heads, idempotency={}, scope_known={SCOPE, EVAL}.__contains__,
                                             stamp=numbered_stamps(), tail=TAIL, registry=REGISTRY, runs={EVAL: run}))
    assert codes(result) == [None]
    version = result.batch.versions[0]
    assert (version.scope_id, version.object_id, version.sequence) == (EVAL, "mem:base", 1)
    assert decode_json(version.meta)["scope_id"] == EVAL
    assert decode_json(result.batch.ledger[0].event)["payload"]["previous_version_id"] == "ver:old"


def test_an_eval_start_retried_with_its_key_is_the_same_start_and_its_record_is_kept_in_the_evaluation_scope() -> None:
    body = {"scope_id": SCOPE, "actor": ACTOR, "snapshot_id": "snap:1", "evaluation_scope_id": EVAL}
    keyed = parse("eval_start", msgspec.json.encode(body), {"Pam-Idempotency-Key": "k:1"}, 1 << 20)
    result = plan([keyed, keyed])
    assert codes(result) == [None, None] and result.outcomes[1].same_as == 0
    assert [(r.scope_id, r.idempotency_key) for r in result.batch.idempotency] == [(EVAL, "k:1")]
    again = plan_batch([keyed], PlanInputs(heads={}, idempotency=result.idempotency, scope_known={SCOPE, EVAL}.__contains__,
                                           stamp=numbered_stamps(), tail=TAIL, registry=REGISTRY, runs=result.runs,
                                           snapshots={"snap:1": DESCRIPTOR}))
    assert codes(again) == [None] and again.outcomes[0].replay_of is not None


def test_another_seed_gives_other_ids_and_no_seed_or_clock_leaves_the_systems() -> None:
    script: list[Parsed | PamledgerError] = [start(), create("mem:a")]
    seeded = plan(script)
    other = plan_batch(script, PlanInputs(heads={}, idempotency={}, scope_known={SCOPE}.__contains__,
                                          stamp=numbered_stamps(), tail=TAIL, registry=REGISTRY,
                                          snapshots={"snap:1": {**DESCRIPTOR, "deterministic_rng_seed": 43}}))
    assert [r.event_id for r in seeded.batch.ledger] != [r.event_id for r in other.batch.ledger]
    undeclared = {k: v for k, v in DESCRIPTOR.items() if k not in ("deterministic_rng_seed", "deterministic_clock")}
    plain = plan_batch(script, PlanInputs(heads={}, idempotency={}, scope_known={SCOPE}.__contains__,
                                          stamp=numbered_stamps(), tail=TAIL, registry=REGISTRY,
                                          snapshots={"snap:1": undeclared}))
    assert [r.event_id for r in plain.batch.ledger] == ["evt:1", "evt:2"]  # the system's stamps
    assert {decode_json(r.event)["recorded_at"] for r in plain.batch.ledger} == {"2026-11-29T12:00:00Z"}
    assert all(decode_json(r.event)["payload"]["evaluation_run_id"] == "run:1" for r in plain.batch.ledger)
