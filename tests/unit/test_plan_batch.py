"""Given loaded heads and a ledger tail, when a batch of commands, then the planner's rows and replies.

Why: the writer commits a whole batch in one transaction, so the planner alone decides that sequences have no
gaps, that the hash chain links every row, and that batch-mates see each other's heads and idempotency keys.
Pure: ids and time come from numbered stamps, heads and idempotency records are built by hand.
"""

from __future__ import annotations

import hashlib
import itertools
from collections.abc import Callable
from datetime import datetime, timezone
from typing import Any

import msgspec

from command_handler.core.decide import decide
from command_handler.core.intake import Parsed, parse
from command_handler.core.planner import Plan, PlanInputs, plan_batch
from command_handler.core.state import ObjectHead, Stamp
from infra.ledger import IdempotencyRow
from schemas.errors import InvalidRequest, PamledgerError
from schemas.registry import default_registry

SCOPE, OTHER = "workspace:plan", "workspace:other"
ACTOR = {"actor_id": "actor:agent:a", "actor_kind": "agent"}
PROV = {"provenance_id": "prov:1", "actor": ACTOR, "activity": "test"}
NOW = datetime(2026, 11, 29, 12, 0, tzinfo=timezone.utc)
REGISTRY = default_registry()
TAIL = (41, hashlib.sha256(b"row 41").digest())


def command(name: str, key: str | None = None, **body: Any) -> Parsed:
    """A command as the writer gets it: parsed from JSON, its idempotency key in the header."""
    headers = {"Pam-Idempotency-Key": key} if key else {}
    return parse(name, msgspec.json.encode({"scope_id": SCOPE, "actor": ACTOR, **body}), headers, 1 << 20)


def create(object_id: str, key: str | None = None, text: str = "x", scope: str = SCOPE) -> Parsed:
    return command("create", key, scope_id=scope, object_id=object_id, object_type="claim",
                   canonical_content={"statement": text}, provenance=PROV)


def update(object_id: str, expected: str, text: str) -> Parsed:
    return command("update", object_id=object_id, expected_version_id=expected,
                   canonical_content={"statement": text}, provenance=PROV)


def numbered_stamps() -> Callable[[Parsed], Stamp]:
    """Stamps op:n, evt:n, ver:n for the n-th command stamped (refused ones included)."""
    counter = itertools.count(1)

    def stamp(item: Parsed) -> Stamp:
        n = next(counter)
        object_id = getattr(item.command, "object_id", None) or f"mem:new{n}"
        return Stamp(operation_id=f"op:{n}", event_id=f"evt:{n}", version_id=f"ver:{n}", object_id=object_id,
                     now=NOW, salt=bytes([n]) * 16)

    return stamp


def plan(items: list[Parsed | PamledgerError], heads: dict[tuple[str, str], ObjectHead] | None = None,
         idempotency: dict[tuple[str, str], IdempotencyRow] | None = None) -> Plan:
    return plan_batch(items, PlanInputs(heads=heads or {}, idempotency=idempotency or {},
                                        scope_known={SCOPE, OTHER}.__contains__, stamp=numbered_stamps(),
                                        tail=TAIL, registry=REGISTRY))


def loaded(object_id: str) -> dict[tuple[str, str], ObjectHead]:
    """The head of an object committed before the batch, at version ver:old."""
    stamp = Stamp(operation_id="op:old", event_id="evt:old", version_id="ver:old", object_id=object_id, now=NOW,
                  salt=b"o" * 16)
    head = decide(None, create(object_id).command, stamp, REGISTRY).head  # type: ignore[arg-type]
    assert head is not None
    return {(SCOPE, object_id): head}


def codes(result: Plan) -> list[str | None]:
    return [o.error.code if o.error is not None else None for o in result.outcomes]


def test_sequences_are_gapless_and_continue_from_the_tail() -> None:
    result = plan([create("mem:a"), create("mem:b"), create("mem:c")])
    assert [row.ledger_sequence for row in result.batch.ledger] == [42, 43, 44]
    assert [v.ledger_sequence for v in result.batch.versions] == [42, 43, 44]
    assert [o.accepted.ledger_sequence for o in result.outcomes if o.accepted is not None] == [42, 43, 44]
    assert result.tail[0] == 44


def test_each_row_hashes_its_sequence_and_event_and_links_to_the_row_before() -> None:
    rows = plan([create("mem:a"), create("mem:b"), create("mem:c")]).batch.ledger
    assert rows[0].prev_hash == TAIL[1]
    assert [r.prev_hash for r in rows[1:]] == [r.row_hash for r in rows[:-1]]
    for row in rows:
        expected = hashlib.sha256(row.prev_hash + row.ledger_sequence.to_bytes(8, "big") + row.event).digest()
        assert row.row_hash == expected
    assert len({r.row_hash for r in rows}) == 3


def test_the_plans_tail_is_the_last_rows_sequence_and_hash() -> None:
    result = plan([create("mem:a"), create("mem:b")])
    assert result.tail == (43, result.batch.ledger[-1].row_hash)


def test_an_update_sees_the_create_before_it_in_the_same_batch() -> None:
    result = plan([create("mem:a", text="one"), update("mem:a", "ver:1", "two")])
    assert codes(result) == [None, None]
    assert [(v.object_id, v.sequence, v.version_id) for v in result.batch.versions] == [
        ("mem:a", 1, "ver:1"), ("mem:a", 2, "ver:2")]
    updated = msgspec.json.decode(result.batch.ledger[1].event)
    assert (updated["event_type"], updated["payload"]["previous_version_id"]) == ("object_updated", "ver:1")
    assert result.heads[(SCOPE, "mem:a")].version_id == "ver:2"


def test_a_second_update_expecting_the_loaded_version_is_a_version_conflict() -> None:
    """The first update moved the head inside the batch, so the second one's expected version is stale."""
    result = plan([update("mem:a", "ver:old", "first"), update("mem:a", "ver:old", "second")], heads=loaded("mem:a"))
    assert codes(result) == [None, "version_conflict"]
    error = result.outcomes[1].error
    assert error is not None and error.details["current_version_id"] == "ver:1"
    assert [(r.ledger_sequence, r.version_id) for r in result.batch.ledger] == [(42, "ver:1")]
    assert result.heads[(SCOPE, "mem:a")].sequence == 2


def test_a_refused_command_mid_batch_takes_no_sequence_and_its_mates_go_on() -> None:
    unparsed = InvalidRequest("malformed create command")
    result = plan([create("mem:a"), update("mem:missing", "ver:9", "y"), unparsed, create("mem:b")])
    assert codes(result) == [None, "object_not_found", "invalid_request", None]
    assert result.outcomes[2].error is unparsed
    rows = result.batch.ledger
    assert [(r.ledger_sequence, r.object_id) for r in rows] == [(42, "mem:a"), (43, "mem:b")]
    assert rows[1].prev_hash == rows[0].row_hash
    last = result.outcomes[3].accepted
    assert last is not None and last.ledger_sequence == 43
    assert result.tail == (43, rows[1].row_hash)


def test_a_key_repeated_in_one_batch_replays_the_first_result_and_writes_nothing_more() -> None:
    """Without the replay the second create would be a conflict (same object id): the key answers it."""
    result = plan([create("mem:a", key="k1"), create("mem:a", key="k1")])
    assert codes(result) == [None, None]
    assert result.outcomes[1].same_as == 0 and result.outcomes[1].accepted is None
    batch = result.batch
    assert (len(batch.ledger), len(batch.versions), len(batch.content)) == (1, 1, 1)
    assert [(r.scope_id, r.idempotency_key, r.object_id, r.version_id, r.ledger_sequence)
            for r in batch.idempotency] == [(SCOPE, "k1", "mem:a", "ver:1", 42)]
    assert result.tail == (42, batch.ledger[0].row_hash)


def test_a_key_repeated_with_another_request_in_one_batch_is_a_duplicate_operation() -> None:
    result = plan([create("mem:a", key="k1", text="one"), create("mem:b", key="k1", text="two")])
    assert codes(result) == [None, "duplicate_operation"]
    assert [r.object_id for r in result.batch.ledger] == ["mem:a"]


def test_a_key_recorded_before_the_batch_replays_its_record_and_writes_nothing() -> None:
    item = create("mem:a", key="k1")
    record = IdempotencyRow(scope_id=SCOPE, idempotency_key="k1", request_digest=item.request_digest,
                            object_id="mem:a", version_id="ver:old", ledger_sequence=7)
    result = plan([item, create("mem:b")], heads=loaded("mem:a"), idempotency={(SCOPE, "k1"): record})
    assert result.outcomes[0].replay_of == record
    assert [(r.ledger_sequence, r.object_id) for r in result.batch.ledger] == [(42, "mem:b")]
    assert result.batch.idempotency == []


def test_rows_name_the_scope_object_version_and_event_type_of_their_command() -> None:
    result = plan([
        create("mem:a"),
        create("mem:b", scope=OTHER),
        command("transition", object_id="mem:a", expected_version_id="ver:1", dimension="validation",
                target_state="corroborated", provenance=PROV),
        command("open_subscription", subscription_id="sub:1", subscription={"filter": {}}),
    ])
    assert codes(result) == [None, None, None, None]
    batch = result.batch
    assert [(r.scope_id, r.object_id, r.version_id, r.event_type, r.event_id) for r in batch.ledger] == [
        (SCOPE, "mem:a", "ver:1", "object_created", "evt:1"),
        (OTHER, "mem:b", "ver:2", "object_created", "evt:2"),
        (SCOPE, "mem:a", "ver:3", "validation_transitioned", "evt:3"),
        (SCOPE, None, None, "subscription_opened", "evt:4"),
    ]
    assert [(v.scope_id, v.object_id, v.sequence, v.ledger_sequence) for v in batch.versions] == [
        (SCOPE, "mem:a", 1, 42), (OTHER, "mem:b", 1, 43), (SCOPE, "mem:a", 2, 44)]
    assert [(c.scope_id, c.object_id, c.content) for c in batch.content] == [
        (SCOPE, "mem:a", b'{"statement":"x"}'), (OTHER, "mem:b", b'{"statement":"x"}')]
    assert msgspec.json.decode(batch.ledger[3].event)["sequence"] == 45  # an event-only entry's own sequence


def test_a_transition_of_an_object_the_batch_created_replies_with_its_content() -> None:
    """The content of a version written earlier in the same batch is known to later commands: a transition
    (which writes no content of its own) answers with it, not with null as if it had been erased."""
    result = plan([create("mem:a", text="kept"),
                   command("transition", object_id="mem:a", expected_version_id="ver:1", dimension="validation",
                           target_state="corroborated", provenance=PROV)])
    created, moved = (o.accepted for o in result.outcomes)
    assert created is not None and moved is not None
    assert created.content is not None and b"kept" in created.content
    assert moved.content == created.content
    assert len(result.batch.content) == 1  # known, not written twice
