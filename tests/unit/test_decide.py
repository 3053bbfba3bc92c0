"""Given a head, when a command, then a decision or an error: tables over the pure core."""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Any

import msgspec
import pytest

from command_handler.core.decide import decide
from command_handler.core.state import ObjectHead, Stamp
from schemas.commands import CreateObject, DeleteObject, TransitionState, UpdateObject
from schemas.errors import PamledgerError
from schemas.registry import default_registry
from schemas.transitions import TRANSITIONS

ACTOR = {"actor_id": "actor:agent:a", "actor_kind": "agent"}
PROV = {"provenance_id": "prov:1", "actor": ACTOR, "activity": "test"}
NOW = datetime(2026, 11, 29, 12, 0, tzinfo=timezone.utc)
REGISTRY = default_registry()


def stamp(n: int = 1, object_id: str = "mem:o1") -> Stamp:
    return Stamp(operation_id=f"op:{n}", event_id=f"evt:{n}", version_id=f"ver:{n}", object_id=object_id,
                 now=NOW, salt=b"s" * 16)


def create(**fields: Any) -> CreateObject:
    body = {"scope_id": "workspace:a", "object_type": "claim", "canonical_content": {"statement": "x"},
            "actor": ACTOR, "provenance": PROV, **fields}
    return msgspec.convert(body, CreateObject)


def command(cls: type, **fields: Any) -> Any:
    body = {"scope_id": "workspace:a", "object_id": "mem:o1", "expected_version_id": "ver:1",
            "actor": ACTOR, "provenance": PROV, **fields}
    return msgspec.convert(body, cls)


def created(**fields: Any) -> ObjectHead:
    return decide(None, create(**fields), stamp(), REGISTRY).head


def code_of(head: ObjectHead | None, cmd: Any) -> str:
    with pytest.raises(PamledgerError) as err:
        decide(head, cmd, stamp(2), REGISTRY)
    return err.value.code


def test_create_assigns_service_fields_and_defaults() -> None:
    decision = decide(None, create(), stamp(), REGISTRY)
    meta = decision.head.meta
    assert (meta["version_id"], meta["sequence"], meta["object_id"]) == ("ver:1", 1, "mem:o1")
    assert meta["committed_at"] == meta["recorded_at"] == "2026-11-29T12:00:00Z"
    assert (meta["lifecycle_state"], meta["availability_state"], meta["retention_state"],
            meta["validation_state"]) == ("active", "available", "retained", "unverified")
    assert meta["provenance"]["recorded_at"] == "2026-11-29T12:00:00Z"
    assert "canonical_content" not in meta
    assert decision.event.event_type == "object_created"
    assert decision.content == b'{"statement":"x"}'
    assert decision.head.content_digest.startswith("sha256:")


def test_the_ledger_event_carries_a_digest_never_the_content() -> None:
    decision = decide(None, create(canonical_content={"secret": "s3cr3t"}), stamp(), REGISTRY)
    assert b"s3cr3t" not in msgspec.json.encode(decision.event)


def test_working_memory_starts_as_scratch() -> None:
    head = created(object_type="working_memory", canonical_content={"task_ref": "task:1", "content": [1]})
    assert head.meta["lifecycle_state"] == "scratch"


@pytest.mark.parametrize("fields, code", [
    ({"object_type": "banana"}, "unsupported_object_type"),
    ({"object_type": "com.example.note"}, "invalid_object"),
    ({"object_type": "tool_invocation", "canonical_content": {"arguments": {}}}, "invalid_object"),
    ({"object_type": "tool_result", "canonical_content": {"outcome": "success"}}, "invalid_object"),
    ({"object_type": "working_memory", "canonical_content": {"content": 1}}, "invalid_object"),
    ({"availability_state": "deleted"}, "invalid_request"),
    ({"actor": {**ACTOR, "attestation": {"not_before": "2026-07-25T00:00:00Z",
                                         "not_after": "2026-07-20T00:00:00Z"}}}, "policy_denied"),
], ids=["unknown-type", "extension-without-schema", "tool-invocation-no-name", "tool-result-no-invocation",
        "working-memory-no-task", "created-deleted", "attestation-inverted"])
def test_create_rejections(fields: dict[str, Any], code: str) -> None:
    assert code_of(None, create(**fields)) == code


def test_extension_type_with_schema_id_is_accepted() -> None:
    head = created(object_type="com.example.note", schema_id="https://example.com/note.json")
    assert head.meta["schema_id"] == "https://example.com/note.json"


def test_create_of_existing_object_id_is_a_version_conflict() -> None:
    assert code_of(created(), create(object_id="mem:o1")) == "version_conflict"


def test_stale_expected_version_is_a_version_conflict_naming_the_current_version() -> None:
    with pytest.raises(PamledgerError) as err:
        decide(created(), command(UpdateObject, expected_version_id="ver:0", canonical_content=1), stamp(2), REGISTRY)
    assert err.value.code == "version_conflict" and err.value.retryable
    assert err.value.details["current_version_id"] == "ver:1"


def test_commands_on_a_missing_object_are_object_not_found() -> None:
    assert code_of(None, command(UpdateObject, canonical_content=1)) == "object_not_found"


def test_update_makes_the_next_version_and_keeps_the_type() -> None:
    decision = decide(created(), command(UpdateObject, canonical_content={"statement": "y"}), stamp(2), REGISTRY)
    assert decision.head.sequence == 2 and decision.head.version_id == "ver:2"
    assert decision.event.event_type == "object_updated"
    assert decision.event.payload.previous_version_id == "ver:1"


ALL_TRANSITIONS = [
    (dim, src, dst)
    for dim, table in TRANSITIONS.items()
    for src in table
    for dst in sorted({s for targets in table.values() for s in targets} | set(table))
]


def head_in(dimension: str, state: str) -> ObjectHead:
    head = created()
    meta = {**head.meta, f"{dimension}_state": state}
    return msgspec.structs.replace(head, meta=meta)


def test_a_state_of_another_dimension_is_an_invalid_state_transition() -> None:
    cmd = command(TransitionState, dimension="lifecycle", target_state="redacted")
    assert code_of(created(), cmd) == "invalid_state_transition"


def test_transition_event_names_the_dimension_and_keeps_the_content_digest() -> None:
    head = created()
    cmd = command(TransitionState, dimension="validation", target_state="corroborated")
    decision = decide(head, cmd, stamp(2), REGISTRY)
    assert decision.event.event_type == "validation_transitioned"
    assert decision.event.payload.from_ == "unverified" and decision.event.payload.to == "corroborated"
    assert decision.head.content_digest == head.content_digest


def test_delete_writes_a_content_free_tombstone_and_erases() -> None:
    decision = decide(created(), command(DeleteObject), stamp(2), REGISTRY)
    assert decision.head.meta["availability_state"] == "deleted"
    assert decision.head.content_digest is None and decision.erase_content
    assert decision.event.event_type == "object_deleted"


@pytest.mark.parametrize("cmd", [
    command(DeleteObject),
    command(TransitionState, dimension="availability", target_state="deleted"),
    command(TransitionState, dimension="availability", target_state="redacted"),
])
def test_legal_hold_blocks_delete_and_redaction(cmd: Any) -> None:
    assert code_of(head_in("retention", "legal_hold"), cmd) == "legal_hold"


def test_writes_after_delete_are_object_deleted() -> None:
    tomb = decide(created(), command(DeleteObject), stamp(2), REGISTRY).head
    cmd = command(UpdateObject, expected_version_id="ver:2", canonical_content=1)
    assert code_of(tomb, cmd) == "object_deleted"


@pytest.mark.parametrize("fields, allowed", [
    ({"dimension": "retention", "target_state": "expired"}, True),
    ({"dimension": "retention", "target_state": "pending_deletion"}, False),
    ({"dimension": "availability", "target_state": "deleted"}, False),
    ({"dimension": "lifecycle", "target_state": "deprecated"}, False),
])
def test_the_retention_actor_only_expires(fields: dict[str, Any], allowed: bool) -> None:
    """The service credential may speak as actor:pamledger:retention (the evaluator): the core holds that actor to
    the one thing it is for, whatever the credential."""
    retention = {"actor_id": "actor:pamledger:retention", "actor_kind": "service"}
    cmd = command(TransitionState, actor=retention, provenance={**PROV, "actor": retention}, **fields)
    if allowed:
        assert decide(created(), cmd, stamp(2), REGISTRY).head.meta["retention_state"] == "expired"
    else:
        assert code_of(created(), cmd) == "access_denied"
    assert code_of(None, create(actor=retention)) == "access_denied"
