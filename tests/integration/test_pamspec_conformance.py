"""What the service emits checked against the official PAMSPEC 0.1-draft JSON Schemas and test vectors.

Why: schemas/ mirrors the PAMSPEC schemas by hand; only validating real service output (envelopes,
ledger events, error envelopes) against the official files catches drift between the two, and driving
the invalid vectors' semantic rules through the service shows it refuses what PAMSPEC says to refuse.
"""

from __future__ import annotations

import contextlib

import json
import re
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from datetime import datetime
from functools import cache
from pathlib import Path
from typing import Any

import psycopg
import pytest
from jsonschema import Draft202012Validator, FormatChecker
from referencing import Registry, Resource
from referencing.jsonschema import DRAFT202012

import msgspec

from embedding.known import descriptor_for, embedder_for
from pamledger_client.protocol.subjects import command_subject, query_subject
from pamledger_client.client import MemoryClient, PamspecError
from pamledger_client.delegation import grant_delegation
from pamledger.supervisor import ROLES as ALL_ROLES
from schemas.common import SYSTEM_SCOPE
from schemas.relationship import is_relationship
from schemas.transitions import TRANSITIONS
from tests.conftest import (
    ACTOR,
    PAMSPEC,
    PROVENANCE,
    TEST_SPACE,
    Env,
    Servers,
    fresh_database,
    fresh_settings,
    pamspec_dir,
    serving,
    wait_for,
)

pytestmark = pytest.mark.profile(  # docs/implementation-report.md
    "PAMSPEC-Lite", "PAMSPEC-Core", "PAMSPEC-Versioning", "PAMSPEC-Ledger", "PAMSPEC-Semantic-Query",
    "PAMSPEC-Protocol-Binding")

SCOPE = "workspace:example"
OTHER_SCOPE = "workspace:other"
TIMEOUT = 30.0
ERROR_RETRYABLE = {"version_conflict": True, "service_unavailable": True}  # section 14: only these say "Yes"

# -- schemas ------------------------------------------------------------------------------------------

_RFC3339 = re.compile(r"^\d{4}-\d{2}-\d{2}[Tt]\d{2}:\d{2}:\d{2}(\.\d+)?([Zz]|[+-]\d{2}:\d{2})$")
FORMATS = FormatChecker(formats=())


@FORMATS.checks("date-time", raises=ValueError)
def _is_date_time(value: object) -> bool:
    """RFC 3339 date-time, checked here because jsonschema needs an optional package for it."""
    if not isinstance(value, str):
        return True
    match = _RFC3339.match(value)
    if match is None:
        return False
    plain = value[: match.start(1)] if match.group(1) else value[: match.start(2)]
    datetime.fromisoformat(plain)  # raises ValueError for a month 13, a day 32, an hour 25 ...
    return True


@cache
def _registry() -> Registry:
    """Every official schema, keyed by its $id and by its bare file name."""
    resources: list[tuple[str, Resource[Any]]] = []
    for path in sorted((pamspec_dir() / "schemas" / "0.1-draft").glob("*.schema.json")):
        contents = json.loads(path.read_text())
        resource = Resource.from_contents(contents, default_specification=DRAFT202012)
        resources += [(contents["$id"], resource), (path.name, resource)]
    return Registry().with_resources(resources)


@cache
def validator(name: str) -> Draft202012Validator:
    """A validator for a schema file name, or for a `file#/pointer` into one."""
    schema = {"$ref": name} if "#" in name else _registry().contents(name)
    return Draft202012Validator(schema, registry=_registry(), format_checker=FORMATS)


def schema_errors(name: str, instance: Any) -> list[str]:
    return [f"{'/'.join(map(str, e.absolute_path)) or '<root>'}: {e.message}"
            for e in validator(name).iter_errors(instance)]


def assert_valid(name: str, instance: Any, label: str = "") -> None:
    errors = schema_errors(name, instance)
    assert not errors, f"{label or name} breaks {name}: {errors}"


def route(instance: dict[str, Any]) -> str:
    """The upstream validator's key sniffing (SOURCE.txt)."""
    keys = instance.keys()
    for needed, schema in ((("code", "retryable"), "error"), (("query",), "query"),
                           (("delegation_id",), "delegation"), (("relationship_id",), "relationship"),
                           (("event_id",), "memory-event"), (("subscription_id", "start_sequence"), "subscription"),
                           (("snapshot_id", "ledger_sequence_high_watermark"), "evaluation-snapshot")):
        if all(k in keys for k in needed):
            return f"{schema}.schema.json"
    return "memory-object.schema.json"


def _files(*parts: str) -> list[Any]:
    """Vector files as params with readable ids; one skipping param when ../shared is absent."""
    folder = PAMSPEC.joinpath(*parts)
    if not folder.is_dir():
        return [pytest.param(None, id="pamspec-absent")]
    return [pytest.param(p, id=p.stem) for p in sorted(folder.glob("*.json"))]


def load(path: Path | None) -> Any:
    pamspec_dir()
    assert path is not None
    return json.loads(path.read_text())


def test_the_date_time_format_is_really_checked() -> None:
    pamspec_dir()
    assert schema_errors("common.schema.json#/$defs/timestamp", "2026-07-17T00:00:00.5Z") == []
    assert schema_errors("common.schema.json#/$defs/timestamp", "2026-07-17T00:00:00+02:00") == []
    for bad in ("yesterday", "2026-07-17", "2026-13-01T00:00:00Z", "2026-07-17T25:00:00Z", "2026-07-17T00:00:00"):
        assert schema_errors("common.schema.json#/$defs/timestamp", bad), bad
    claim = json.loads((pamspec_dir() / "test-vectors" / "valid" / "claim-creation.json").read_text())
    assert schema_errors("memory-object.schema.json", {**claim, "committed_at": "yesterday"})


def test_transition_table_equals_the_drafts_machine_readable_table() -> None:
    official = json.loads((pamspec_dir() / "extracted" / "state-transitions.from-draft-section9.json").read_text())
    assert {d: {s: sorted(t) for s, t in states.items()} for d, states in TRANSITIONS.items()} == \
        {d: {s: sorted(t) for s, t in states.items()} for d, states in official.items()}


# -- vectors ------------------------------------------------------------------------------------------

@pytest.mark.parametrize("path", _files("test-vectors", "valid"))
def test_valid_vector_validates_against_its_routed_schema(path: Path | None) -> None:
    instance = load(path)
    assert_valid(route(instance), instance, str(path))


@pytest.mark.parametrize("path", _files("examples"))
def test_example_validates_against_its_routed_schema(path: Path | None) -> None:
    instance = load(path)
    if path is not None and path.stem == "version-chain":
        pytest.skip("examples/version-chain.json is not schema-bound (SOURCE.txt)")
    assert_valid(route(instance), instance, str(path))


@pytest.mark.parametrize("path", _files("test-vectors", "invalid"))
def test_invalid_vector_behaves_as_its_file_says(path: Path | None) -> None:
    vector = load(path)
    if "schema" in vector:
        assert schema_errors(vector["schema"], vector["instance"]), f"{path} should fail {vector['schema']}"
    elif "semanticRule" in vector:
        assert vector["expected_failure"] in validator("error.schema.json").schema["properties"]["code"]["enum"]
    else:
        assert_valid("error.schema.json", vector["instance"], str(path))
        assert vector["instance"]["code"] == vector["expected_failure"]


# -- the running service --------------------------------------------------------------------------------

@pytest.fixture(scope="module")
async def scope(client: MemoryClient) -> str:
    pamspec_dir()
    await client.create_scope(SCOPE)
    await client.create_scope(OTHER_SCOPE)  # the cross-scope relationship vector's target scope
    return SCOPE


def id_of(result: dict[str, Any]) -> str:
    """A write result's id: `relationship_id` for a Relationship Version, else `object_id`."""
    return str(result["relationship_id"] if "relationship_id" in result else result["object_id"])


async def wire(env: Env, client: MemoryClient, kind: str, name: str, body: dict[str, Any] | bytes) -> Any:
    """One raw request/reply, so error envelopes are checked exactly as the wire carries them."""
    prefix = env.settings.subject_prefix
    subject = command_subject(prefix, name) if kind == "cmd" else query_subject(prefix, name)
    payload = body if isinstance(body, bytes) else json.dumps(body).encode()
    return json.loads((await client.nc.request(subject, payload, timeout=TIMEOUT)).data)


def _uid(kind: str) -> str:
    return f"mem:{kind}:{uuid.uuid4().hex[:12]}"


CONTENT: dict[str, Any] = {
    "claim": {"statement": "Persistent memory is distinct from temporary context."},
    "decision": {"summary": "Use immutable versions."}, "task": {"title": "Write conformance tests"},
    "artifact": {"uri": "https://example.com/a.pdf"}, "observation": "the build is green",
    "entity": {"name": "pamledger"}, "summary": 42,
    "tool_invocation": {"tool_name": "web_search", "arguments": {"q": "pamspec"}},
    "working_memory": {"task_ref": "task:planning:1", "content": {"steps": ["a", "b"]}},
}
FULL_ACTOR = {
    "actor_id": "actor:agent:deployer-01", "actor_kind": "agent", "display_name": "Deployer",
    "on_behalf_of_actor_id": "actor:human:ops", "delegation_id": "del:grant:1",
    "attestation": {"attestation_method": "sigstore", "issued_at": "2026-07-16T00:00:00Z",
                    "not_before": "2026-07-16T00:00:00Z", "not_after": "2026-07-23T00:00:00Z",
                    "capabilities_declared": ["read", "update"]},
}
FULL_OPTIONALS: dict[str, Any] = {
    "observed_at": "2026-07-12T00:00:00Z", "asserted_at": "2026-07-12T00:00:00.5Z",
    "valid_from": "2026-07-12T00:00:00+02:00", "valid_until": "2027-01-01T00:00:00Z",
    "relationship_refs": ["rel:001"], "integrity": {"digest": "sha256:ab", "algorithm": "sha-256"},
    "quality_signals": {"assessed_confidence": 0.9, "last_verified_at": "2026-07-12T00:00:00Z"},
}

STEPS = (("lifecycle", "deprecated"), ("lifecycle", "archived"), ("lifecycle", "active"), ("validation", "disputed"),
         ("retention", "legal_hold"), ("retention", "retained"), ("retention", "pending_deletion"),
         ("availability", "deleted"))


@pytest.fixture(scope="module")
async def story(client: MemoryClient, scope: str) -> dict[str, Any]:
    """Drive every write the service has over several object types; keep what it returned."""
    writes: list[tuple[str, dict[str, Any]]] = []
    ids: list[str] = []

    async def note(label: str, call: Awaitable[dict[str, Any]]) -> dict[str, Any]:
        result = await call
        writes.append((label, result))
        if id_of(result) not in ids:
            ids.append(id_of(result))
        return result

    created = {t: await note(f"create {t}", client.create(scope, t, c, ACTOR, PROVENANCE)) for t, c in CONTENT.items()}
    await note("create tool_result", client.create(scope, "tool_result", {
        "invocation_object_id": created["tool_invocation"]["object_id"], "outcome": "success",
        "result": {"hits": 3}, "completed_at": "2026-07-17T00:00:00.850000Z"}, ACTOR, PROVENANCE))
    await note("create extension", client.create(scope, "com.example.memory.note", {"text": "x"}, ACTOR, PROVENANCE,
                                                 schema_id="https://example.com/schemas/note.json"))
    full = await note("create full", client.create(
        scope, "claim", {"statement": "s"}, FULL_ACTOR,
        {**PROVENANCE, "actor": FULL_ACTOR, "source_ref": "urn:source:review", "evidence_refs": ["urn:e:1"],
         "source_confidence": 0.8, "observed_at": "2026-07-12T00:00:00Z"},
        object_id=_uid("claim"), validation_state="corroborated", **FULL_OPTIONALS))
    oid = full["object_id"]
    head = (await note("update", client.update(scope, oid, full["version_id"], {"statement": "s2"}, ACTOR,
                                               PROVENANCE)))["version_id"]
    for dimension, target in STEPS:  # archived -> active is "with policy override" (table 5)
        override = (dimension, target) == ("lifecycle", "active")
        head = (await note(f"{dimension}->{target}", client.transition(
            scope, oid, head, dimension, target, ACTOR, PROVENANCE, policy_basis="policy:conformance",
            policy_override=override)))["version_id"]
    made = await note("create to redact", client.create(scope, "claim", {"statement": "r"}, ACTOR, PROVENANCE))
    await note("redact", client.transition(scope, made["object_id"], made["version_id"], "availability", "redacted",
                                           ACTOR, PROVENANCE, policy_basis="policy:pii"))
    made = await note("create to delete", client.create(scope, "claim", {"statement": "d"}, ACTOR, PROVENANCE))
    await note("delete", client.delete(scope, made["object_id"], made["version_id"], ACTOR, PROVENANCE))
    key = f"idem:{uuid.uuid4().hex}"
    for label in ("idempotent create", "idempotent replay"):
        await note(label, client.create(scope, "task", {"title": "once"}, ACTOR, PROVENANCE, idempotency_key=key))
    await _object_model_story(client, scope, created, note)
    return {"writes": writes, "ids": ids, "created": created}


async def _object_model_story(client: MemoryClient, scope: str, created: dict[str, dict[str, Any]],
                              note: Callable[[str, Awaitable[dict[str, Any]]], Awaitable[dict[str, Any]]]) -> None:
    """[M5] Relationship Objects (created, updated, transitioned, across scopes), partial and suppressing
    redactions with a restoration, a promotion, a provenance correction and an overridden transition."""
    claim, task = created["claim"], created["task"]
    rel = await note("relate", client.relate(scope, claim["object_id"], task["object_id"], "supports", ACTOR,
                                             {**PROVENANCE, "activity": "related"}, canonical_content={"weight": 1},
                                             observed_at="2026-07-12T00:00:00Z"))
    rel = await note("relate update", client.relate(
        scope, claim["object_id"], task["object_id"], "supports", ACTOR, PROVENANCE, canonical_content={"weight": 2},
        relationship_id=rel["relationship_id"], expected_version_id=rel["version_id"]))
    await note("relationship lifecycle->deprecated", client.transition(
        scope, rel["relationship_id"], rel["version_id"], "lifecycle", "deprecated", ACTOR, PROVENANCE))
    elsewhere = await client.create(OTHER_SCOPE, "claim", {"statement": "o"}, ACTOR, PROVENANCE)
    await note("relate across scopes", client.relate(
        scope, claim["object_id"], elsewhere["object_id"], "com.example.cites", ACTOR, PROVENANCE,
        target_scope_id=OTHER_SCOPE, policy_basis="policy:cross-scope", directionality="undirected"))
    secret = await note("create to redact partially", client.create(
        scope, "claim", {"statement": "ana was there", "visible_fields": ["title"]}, ACTOR, PROVENANCE))
    await note("partial redaction", client.redact(scope, secret["object_id"], secret["version_id"], ACTOR, PROVENANCE,
                                                  "gdpr:art17", pointers=["/statement"]))
    held = await note("create to suppress", client.create(scope, "claim", {"statement": "hold"}, ACTOR, PROVENANCE))
    held = await note("suppressing redaction", client.redact(scope, held["object_id"], held["version_id"], ACTOR,
                                                             PROVENANCE, "review:hold", erase=False))
    await note("restoration", client.transition(scope, held["object_id"], held["version_id"], "availability",
                                                "available", ACTOR, PROVENANCE, policy_basis="restoration:ticket-1"))
    promoted = await note("promote", client.promote(
        scope, created["working_memory"]["object_id"], created["working_memory"]["version_id"], "decision",
        {"summary": "consolidated"}, ACTOR, {**PROVENANCE, "activity": "consolidated"},
        quality_signals={"assessed_confidence": 0.7}))
    await note("the promotion's derived_from", _read_as_write(client, scope, promoted["promotion"]["relationship_id"]))
    source = {**PROVENANCE, "source_ref": "urn:source:a", "evidence_refs": ["urn:e:1"]}
    made = await note("create to correct", client.create(scope, "claim", {"statement": "c"}, ACTOR, source))
    await note("provenance correction", client.correct_provenance(
        scope, made["object_id"], made["version_id"], ACTOR, {**PROVENANCE, "provenance_id": "prov:corrected"},
        removed_fields=["evidence_refs", "source_ref"], policy_basis="audit:1"))
    scratch = await note("create scratch", client.create(scope, "working_memory", {"task_ref": "task:x", "content": 1},
                                                         ACTOR, PROVENANCE))
    await note("scratch->active by override", client.transition(
        scope, scratch["object_id"], scratch["version_id"], "lifecycle", "active", ACTOR, PROVENANCE,
        policy_basis="policy:override:1", policy_override=True))


async def _read_as_write(client: MemoryClient, scope: str, relationship_id: str) -> dict[str, Any]:
    """A relationship a promotion made, shaped as a write result so the story checks it like the others."""
    envelope = await client.read(scope, relationship_id)
    return {"relationship_id": relationship_id, "version_id": envelope["version_id"], "envelope": envelope}


def envelope_schema(envelope: dict[str, Any]) -> str:
    """relationship.schema.json for a Relationship Version, memory-object.schema.json for a Memory Version."""
    schema = route(envelope)
    assert schema in ("memory-object.schema.json", "relationship.schema.json"), schema
    assert (schema == "relationship.schema.json") == is_relationship(envelope)
    return schema


async def test_every_write_result_envelope_validates(story: dict[str, Any]) -> None:
    schemas = set()
    for label, result in story["writes"]:
        schemas.add(envelope_schema(result["envelope"]))
        assert_valid(envelope_schema(result["envelope"]), result["envelope"], label)
        field = "relationship_id" if "relationship_id" in result else "object_id"
        assert (result[field], result["version_id"]) == (result["envelope"][field], result["envelope"]["version_id"])
    assert schemas == {"memory-object.schema.json", "relationship.schema.json"}


async def test_the_object_model_writes_reach_the_states_and_links_they_name(story: dict[str, Any]) -> None:
    """[M5] What the story's relate / redact / promote / correct_provenance results say, beyond the schemas."""
    results = dict(story["writes"])
    assert results["relate"]["envelope"]["relationship_type"] == "supports"
    assert results["relate update"]["sequence"] == 2
    assert results["relationship lifecycle->deprecated"]["envelope"]["lifecycle_state"] == "deprecated"
    assert results["relate across scopes"]["envelope"]["target_scope_id"] == OTHER_SCOPE
    partial = results["partial redaction"]["envelope"]
    vector = load(pamspec_dir() / "test-vectors" / "valid" / "partial-redaction.json")
    assert (partial["availability_state"], partial["canonical_content"]) == (
        vector["availability_state"], vector["canonical_content"])
    assert results["restoration"]["envelope"]["canonical_content"] == {"statement": "hold"}
    promoted = results["promote"]
    assert promoted["envelope"]["provenance"]["transformation_parent"] == story["created"]["working_memory"]["version_id"]
    derived = results["the promotion's derived_from"]["envelope"]
    assert (derived["relationship_type"], derived["source_object_id"], derived["target_object_id"]) == (
        "derived_from", promoted["object_id"], story["created"]["working_memory"]["object_id"])
    assert results["provenance correction"]["envelope"]["provenance"]["provenance_id"] == "prov:corrected"
    assert results["scratch->active by override"]["envelope"]["lifecycle_state"] == "active"


async def test_every_readable_version_validates(client: MemoryClient, scope: str, story: dict[str, Any]) -> None:
    seen = redacted = 0
    for object_id in story["ids"]:
        versions = (await client.history(scope, object_id))["versions"]
        redacted += versions[-1]["availability_state"] == "redacted"  # no version of it reads any more
        for version in versions:
            try:
                envelope = await client.read(scope, object_id, version["version_id"])
            except PamspecError as exc:
                assert exc.code in ("object_deleted", "object_redacted"), exc
                continue
            assert_valid(envelope_schema(envelope), envelope, f"read {object_id}@{version['sequence']}")
            seen += 1
        try:
            current = await client.read(scope, object_id)
            assert_valid(envelope_schema(current), current, f"read {object_id}")
        except PamspecError as exc:
            assert exc.code in ("object_deleted", "object_redacted"), exc
    assert seen >= len(story["ids"]) - redacted


async def test_every_history_version_and_event_validates(client: MemoryClient, scope: str,
                                                         story: dict[str, Any]) -> None:
    for object_id in story["ids"]:
        history = await client.history(scope, object_id)
        assert [v["sequence"] for v in history["versions"]] == list(range(1, len(history["versions"]) + 1))
        for version in history["versions"]:
            assert_valid(envelope_schema(version), version, f"history {object_id}@{version['sequence']}")
        # one entry per version, plus event-only entries about the object (tool_invoked, tool_completed, ...)
        assert len([e for e in history["events"] if e["event"].get("version_id")]) == len(history["versions"])
        for entry in history["events"]:
            assert_valid("memory-event.schema.json", entry["event"], f"event {entry['ledger_sequence']}")


async def test_every_event_replicated_to_jetstream_validates(service: Env, client: MemoryClient,
                                                             story: dict[str, Any]) -> None:
    async with await psycopg.AsyncConnection.connect(service.database_url) as conn:
        row = await (await conn.execute("SELECT coalesce(max(ledger_sequence), 0) FROM ledger")).fetchone()
    head = int(row[0]) if row else 0
    assert head >= len(story["writes"]) - 1  # the replay writes nothing
    js = client.nc.jetstream()
    stream = service.settings.stream_name

    async def replicated() -> bool:
        return int((await js.stream_info(stream)).state.last_seq) >= head

    await wait_for(replicated, timeout=60)
    for seq in range(1, head + 1):
        msg = await js.get_msg(stream, seq)
        assert msg.headers is not None and msg.headers["Pam-Ledger-Sequence"] == str(seq)
        assert_valid("memory-event.schema.json", json.loads(msg.data or b""), f"stream message {seq}")


# -- error envelopes -----------------------------------------------------------------------------------

Trigger = Callable[[Env, MemoryClient], Awaitable[Any]]


def _create_body(object_type: str = "claim", content: Any = None, **extra: Any) -> dict[str, Any]:
    return {"scope_id": SCOPE, "object_type": object_type, "canonical_content": content or {"statement": "x"},
            "actor": ACTOR, "provenance": PROVENANCE, **extra}


async def _made(client: MemoryClient, **extra: Any) -> dict[str, Any]:
    return await client.create(SCOPE, "claim", {"statement": "made"}, ACTOR, PROVENANCE, **extra)


def _write(made: dict[str, Any], **extra: Any) -> dict[str, Any]:
    return {"scope_id": SCOPE, "object_id": made["object_id"], "expected_version_id": made["version_id"],
            "actor": ACTOR, "provenance": PROVENANCE, **extra}


async def _stale(env: Env, client: MemoryClient) -> Any:
    made = await _made(client)
    await client.update(SCOPE, made["object_id"], made["version_id"], {"statement": "v2"}, ACTOR, PROVENANCE)
    return await wire(env, client, "cmd", "update", _write(made, canonical_content={"statement": "v3"}))


async def _duplicate(env: Env, client: MemoryClient) -> Any:
    key = f"idem:{uuid.uuid4().hex}"
    await client.create(SCOPE, "claim", {"statement": "A"}, ACTOR, PROVENANCE, idempotency_key=key)
    return await wire(env, client, "cmd", "create", _create_body(content={"statement": "B"}, idempotency_key=key))


async def _legal_hold(env: Env, client: MemoryClient) -> Any:
    made = await _made(client, retention_state="legal_hold")
    return await wire(env, client, "cmd", "delete", _write(made))


async def _deleted(env: Env, client: MemoryClient) -> Any:
    made = await _made(client)
    await client.delete(SCOPE, made["object_id"], made["version_id"], ACTOR, PROVENANCE)
    return await wire(env, client, "query", "read", {"scope_id": SCOPE, "object_id": made["object_id"]})


async def _redacted(env: Env, client: MemoryClient) -> Any:
    made = await _made(client)
    await client.transition(SCOPE, made["object_id"], made["version_id"], "availability", "redacted", ACTOR,
                            PROVENANCE)
    return await wire(env, client, "query", "read", {"scope_id": SCOPE, "object_id": made["object_id"]})


async def _bad_transition(env: Env, client: MemoryClient) -> Any:
    made = await _made(client)
    return await wire(env, client, "cmd", "transition", _write(made, dimension="lifecycle", target_state="scratch"))


async def _moved_endpoints(env: Env, client: MemoryClient) -> Any:
    a, b = await _made(client), await _made(client)
    made = await client.relate(SCOPE, a["object_id"], b["object_id"], "supports", ACTOR, PROVENANCE)
    return await wire(env, client, "cmd", "relate", {
        "scope_id": SCOPE, "source_object_id": b["object_id"], "target_object_id": a["object_id"],
        "relationship_type": "supports", "directionality": "directed", "actor": ACTOR, "provenance": PROVENANCE,
        "relationship_id": made["relationship_id"], "expected_version_id": made["version_id"]})


async def _cross_scope_unbased(env: Env, client: MemoryClient) -> Any:
    a, b = await _made(client), await client.create(OTHER_SCOPE, "claim", {"statement": "o"}, ACTOR, PROVENANCE)
    return await wire(env, client, "cmd", "relate", {
        "scope_id": SCOPE, "source_object_id": a["object_id"], "target_object_id": b["object_id"],
        "target_scope_id": OTHER_SCOPE, "relationship_type": "references", "directionality": "directed",
        "actor": ACTOR, "provenance": PROVENANCE})


async def _unresolved_pointer(env: Env, client: MemoryClient) -> Any:
    made = await _made(client)
    return await wire(env, client, "cmd", "redact", _write(made, policy_basis="p",
                                                           redaction_target={"pointers": ["/absent"]}))


async def _promote_claim(env: Env, client: MemoryClient) -> Any:
    made = await _made(client)
    return await wire(env, client, "cmd", "promote", {
        "scope_id": SCOPE, "source_object_id": made["object_id"], "expected_version_id": made["version_id"],
        "target_object_type": "decision", "target_canonical_content": {}, "actor": ACTOR, "provenance": PROVENANCE})


INVERTED = {**ACTOR, "attestation": {"not_before": "2026-07-25T00:00:00Z", "not_after": "2026-07-20T00:00:00Z"}}


def _send(kind: str, name: str, body: dict[str, Any] | bytes) -> Trigger:
    async def trigger(env: Env, client: MemoryClient) -> Any:
        return await wire(env, client, kind, name, body)
    return trigger


ABSENT = {"object_id": "mem:absent:2", "version_id": "ver:absent:1"}
ERROR_CASES = [
    pytest.param("invalid_request", _send("cmd", "create", b"{not json"), id="invalid_request-not-json"),
    pytest.param("invalid_request", _send("cmd", "create", _create_body(colour="red")),
                 id="invalid_request-unknown-field"),
    pytest.param("invalid_request", _send("query", "read", {"scope_id": SCOPE}), id="invalid_request-read-no-object"),
    pytest.param("invalid_object", _send("cmd", "create", _create_body("tool_invocation", {"arguments": {}})),
                 id="invalid_object-tool-invocation-content"),
    pytest.param("unsupported_object_type", _send("cmd", "create", _create_body("Not A Type")),
                 id="unsupported_object_type"),
    pytest.param("object_not_found", _send("query", "read", {"scope_id": SCOPE, "object_id": "mem:absent:1"}),
                 id="object_not_found-read"),
    pytest.param("object_not_found", _send("cmd", "update", _write(ABSENT, canonical_content=1)),
                 id="object_not_found-update"),
    pytest.param("scope_not_found", _send("query", "read", {"scope_id": "workspace:never", "object_id": "mem:a:1"}),
                 id="scope_not_found-read"),
    pytest.param("scope_not_found", _send("cmd", "create", {**_create_body(), "scope_id": "workspace:never"}),
                 id="scope_not_found-create"),
    pytest.param("version_conflict", _stale, id="version_conflict-stale-update"),
    pytest.param("duplicate_operation", _duplicate, id="duplicate_operation-same-key-new-content"),
    pytest.param("invalid_state_transition", _bad_transition, id="invalid_state_transition-active-to-scratch"),
    pytest.param("legal_hold", _legal_hold, id="legal_hold-delete"),
    pytest.param("object_deleted", _deleted, id="object_deleted-read"),
    pytest.param("object_redacted", _redacted, id="object_redacted-read"),
    pytest.param("policy_denied", _send("cmd", "create", _create_body(actor=INVERTED)),
                 id="policy_denied-inverted-attestation"),
    pytest.param("relationship_conflict", _moved_endpoints, id="relationship_conflict-endpoints-moved"),
    pytest.param("policy_denied", _cross_scope_unbased, id="policy_denied-cross-scope-relate-without-basis"),
    pytest.param("invalid_request", _unresolved_pointer, id="invalid_request-redaction-pointer-unresolved"),
    pytest.param("invalid_request", _promote_claim, id="invalid_request-promote-non-working-memory"),
]


@pytest.mark.parametrize(("code", "trigger"), ERROR_CASES)
async def test_error_envelope_validates_with_its_code_and_retryable_flag(
    service: Env, client: MemoryClient, scope: str, code: str, trigger: Trigger
) -> None:
    reply = await trigger(service, client)
    assert set(reply) == {"error"}, reply
    error = reply["error"]
    assert_valid("error.schema.json", error, code)
    assert error["code"] == code, error
    assert error["retryable"] is ERROR_RETRYABLE.get(code, False)
    if code == "version_conflict":
        assert error["details"]["current_version_id"]


def test_error_cases_cover_every_code_the_service_produces() -> None:
    covered = {p.values[0] for p in ERROR_CASES}
    assert covered >= {"invalid_request", "invalid_object", "unsupported_object_type", "object_not_found",
                       "scope_not_found", "version_conflict", "duplicate_operation", "invalid_state_transition",
                       "legal_hold", "object_deleted", "policy_denied", "relationship_conflict"}


# -- invalid vectors the service can act on ------------------------------------------------------------

Driver = Callable[[MemoryClient, dict[str, Any]], Awaitable[Any]]


async def _transition_from(client: MemoryClient, dimension: str, start: str, target: str) -> Any:
    made = await _made(client, **{f"{dimension}_state": start})
    return await client.transition(SCOPE, made["object_id"], made["version_id"], dimension, target, ACTOR,
                                   PROVENANCE)


async def _silent_overwrite(client: MemoryClient, vector: dict[str, Any]) -> Any:
    made = await _made(client)
    await client.update(SCOPE, made["object_id"], made["version_id"], {"statement": "v2"}, ACTOR, PROVENANCE)
    return await client.update(SCOPE, made["object_id"], made["version_id"], {"statement": "overwrite"}, ACTOR,
                               PROVENANCE)


async def _attestation(client: MemoryClient, vector: dict[str, Any]) -> Any:
    i = vector["instance"]
    return await client.create(SCOPE, i["object_type"], i["canonical_content"], i["actor"], i["provenance"])


async def _delete_under_hold(client: MemoryClient, vector: dict[str, Any]) -> Any:
    made = await _made(client)
    held = await client.transition(SCOPE, made["object_id"], made["version_id"], "retention", "legal_hold", ACTOR,
                                   PROVENANCE)
    return await client.delete(SCOPE, made["object_id"], held["version_id"], ACTOR, PROVENANCE)


async def _duplicate_key(client: MemoryClient, vector: dict[str, Any]) -> Any:
    key = f"{vector['instance']['details']['idempotency_key']}:{uuid.uuid4().hex}"
    await client.create(SCOPE, "claim", {"statement": "first"}, ACTOR, PROVENANCE, idempotency_key=key)
    return await client.create(SCOPE, "claim", {"statement": "different"}, ACTOR, PROVENANCE, idempotency_key=key)


def _content_of(object_type: str) -> Driver:
    async def drive(client: MemoryClient, vector: dict[str, Any]) -> Any:
        return await client.create(SCOPE, object_type, vector["instance"], ACTOR, PROVENANCE)
    return drive


async def _cross_scope_relationship(client: MemoryClient, vector: dict[str, Any]) -> Any:
    i = vector["instance"]
    source, target = await _made(client), await client.create(OTHER_SCOPE, "artifact", {"uri": "urn:a"}, ACTOR,
                                                              PROVENANCE)
    assert i["target_scope_id"] != i["scope_id"] and "policy_basis" not in i
    return await client.relate(SCOPE, source["object_id"], target["object_id"], i["relationship_type"], i["actor"],
                               i["provenance"], directionality=i["directionality"],
                               canonical_content=i["canonical_content"], target_scope_id=OTHER_SCOPE)


async def _promote_non_working_memory(client: MemoryClient, vector: dict[str, Any]) -> Any:
    i = vector["instance"]
    made = await _made(client)
    return await client.promote(SCOPE, made["object_id"], made["version_id"], i["target_object_type"],
                                i["target_canonical_content"], i["actor"], i["provenance"])


async def _result_without_invocation(client: MemoryClient, vector: dict[str, Any]) -> Any:
    """The vector's content lacks invocation_object_id (a schema failure); the semantic twin names an
    invocation that does not exist in the scope: both are invalid_object."""
    named = {**vector["instance"], "invocation_object_id": "mem:toolinv:never-made"}
    with pytest.raises(PamspecError) as caught:
        await client.create(SCOPE, "tool_result", named, ACTOR, PROVENANCE)
    assert caught.value.code == vector["expected_failure"]
    return await client.create(SCOPE, "tool_result", vector["instance"], ACTOR, PROVENANCE)


def _transition_vector(dimension: str | None) -> Driver:
    async def drive(client: MemoryClient, vector: dict[str, Any]) -> Any:
        i = vector["instance"]
        dim = dimension or i["dimension"]
        start = i["from"] if dimension else "active"
        return await _transition_from(client, dim, start, i["to"])
    return drive


async def _inverted_delegation(client: MemoryClient, vector: dict[str, Any]) -> Any:
    """The vector's grant as it stands (its window ends before it begins): the writer refuses to record it."""
    i = vector["instance"]
    return await grant_delegation(client, SCOPE, i["granting_actor"], i["delegated_actor"], i["granted_operations"],
                                  i["policy_basis"], i["not_before"], i["not_after"],
                                  delegation_id=f"{i['delegation_id']}:{uuid.uuid4().hex[:8]}")


async def _vector_without_space(client: MemoryClient, vector: dict[str, Any]) -> Any:
    """A bare vector, no space named, on a service where no Embedding Space is registered (this module's
    service runs no indexer): it belongs to no space, so no search can compare it with anything.
    test_a_vector_naming_no_space_is_read_in_the_default_space covers a service with a default space."""
    return await client.search(SCOPE, vector=vector["instance"]["vector"], mode="semantic")


async def _sealed_then_mutated(client: MemoryClient, vector: dict[str, Any]) -> Any:
    """The vector's snapshot sealed without its member added after the seal, then the vector's descriptor
    (that member added) sent under the same id: a sealed snapshot never changes."""
    i = vector["instance"]
    snapshot_id = f"{i['snapshot_id']}:{uuid.uuid4().hex[:8]}"
    members = [m for m in i["included_object_ids"] if "added-after-seal" not in m]
    for member in members:  # a snapshot's named members are objects its scope holds
        with contextlib.suppress(PamspecError):  # made by an earlier run of this driver: version_conflict
            await client.create(SCOPE, "claim", {"statement": member}, ACTOR, PROVENANCE, object_id=member)
    sealed = await client.snapshot_create(SCOPE, ACTOR, object_ids=members, snapshot_id=snapshot_id,
                                          evaluation_run_id=i["evaluation_run_id"])
    assert_valid("evaluation-snapshot.schema.json", sealed["snapshot"])
    try:
        return await client.command("snapshot_create", {"scope_id": SCOPE, "actor": ACTOR, "snapshot": {
            **i, "snapshot_id": snapshot_id, "scope_id": SCOPE}})
    except PamspecError as exc:
        assert exc.details.get("rule") == vector["semanticRule"], exc
        raise


async def _unsealed_snapshot(client: MemoryClient, vector: dict[str, Any]) -> Any:
    """The vector's descriptor (sealed: false) sent to be sealed: a client cannot send an unsealed one."""
    return await client.command("snapshot_create", {"scope_id": SCOPE, "actor": ACTOR,
                                                    "snapshot": {**vector["instance"], "scope_id": SCOPE}})


LEFT, RIGHT = descriptor_for(TEST_SPACE), descriptor_for("hashing-32")  # two incompatible spaces


def _vector_in(space_model: str, text: str) -> list[float]:
    """A real vector of `space_model`'s space, made by its own embedder (what an indexer stores)."""
    embedder = embedder_for(descriptor_for(space_model))
    assert embedder is not None
    return embedder.embed([text])[0]


async def _across_spaces(client: MemoryClient, vector: dict[str, Any]) -> Any:
    """A vector of the left space searched in the right one: comparing them is refused. (The service sees a
    vector's space only through its length: docs/implementation-report.md, known deviations.)"""
    left = _vector_in(TEST_SPACE, "the build is green")
    same = await client.search(SCOPE, vector=left, space=LEFT.embedding_space_id, mode="semantic")
    assert same["embedding_space_id"] == LEFT.embedding_space_id  # within its own space it is searched
    return await client.search(SCOPE, vector=left, space=RIGHT.embedding_space_id, mode="semantic")


DRIVERS: dict[str, Driver] = {
    "invalid-lifecycle-transition": _transition_vector("lifecycle"),
    "invalid-validation-transition": _transition_vector("validation"),
    "invalid-cross-dimensional-transition": _transition_vector(None),
    "silent-overwrite-attempt": _silent_overwrite,
    "stale-expected-version": _silent_overwrite,
    "attestation-window-inverted": _attestation,
    "deletion-blocked-by-legal-hold": _delete_under_hold,
    "duplicate-operation-different-content": _duplicate_key,
    "tool-invocation-missing-tool-name": _content_of("tool_invocation"),
    "tool-result-without-invocation": _result_without_invocation,
    "cross-scope-relationship-without-policy": _cross_scope_relationship,
    "promote-of-non-working-memory": _promote_non_working_memory,
    "working-memory-missing-task-ref": _content_of("working_memory"),
    "delegation-window-inverted": _inverted_delegation,
    "vector-without-embedding-space": _vector_without_space,
    "evaluation-snapshot-membership-mutated": _sealed_then_mutated,
    "evaluation-snapshot-unsealed": _unsealed_snapshot,
}
# Vectors that need Embedding Spaces, driven against a second service that runs the indexer (`spaces_client`).
SPACE_DRIVERS: dict[str, Driver] = {
    "comparison-across-incompatible-spaces": _across_spaces,
}
SKIPS = {
    "reused-immutable-version-identifier": "only an import carries given version ids: its refusal of a reused"
                                           " one (invalid_object, version_id_reuse) is tested in test_bundle.py;"
                                           " this vector's two bare envelopes are no bundle to import",
}


def _service_vectors(spaces: bool = False) -> list[Any]:
    """The invalid vectors the service can act on: every semanticRule one and those with a driver; `spaces`:
    the ones SPACE_DRIVERS drive (against spaces_client), else the others."""
    params = []
    for param in _files("test-vectors", "invalid"):
        path = param.values[0]
        if path is not None and (path.stem in SPACE_DRIVERS) != spaces:
            continue
        if path is None or "semanticRule" in json.loads(path.read_text()) or path.stem in DRIVERS:
            params.append(param)
    return params


@pytest.mark.parametrize("path", _service_vectors())
async def test_invalid_vector_is_refused_by_the_service_with_its_code(client: MemoryClient, scope: str,
                                                                      path: Path | None) -> None:
    vector = load(path)
    assert path is not None
    if path.stem in SKIPS:
        pytest.skip(SKIPS[path.stem])
    driver = DRIVERS.get(path.stem)
    assert driver is not None, f"{path.name}: a semanticRule vector with neither a driver nor a skip reason"
    with pytest.raises(PamspecError) as caught:
        await driver(client, vector)
    assert caught.value.code == vector["expected_failure"], caught.value
    assert caught.value.retryable is ERROR_RETRYABLE.get(caught.value.code, False)


@pytest.fixture(scope="module")
async def spaces_client(servers: Servers) -> AsyncIterator[MemoryClient]:
    """A second service of its own (database, subjects, stream) that runs the indexer: its default space is
    LEFT, and RIGHT is registered beside it. Apart from this module's service so that the indexer's entries
    (space registrations, embedding records) never reach the scopes the other tests count."""
    env = Env(servers, fresh_database(servers, "conf_spaces"), fresh_settings("conf_spaces"))
    async with serving(env, ALL_ROLES, roles=ALL_ROLES) as client:
        await client.create_scope(SCOPE)
        await client.create(SCOPE, "claim", {"statement": "the build is green"}, ACTOR, PROVENANCE,
                            validation_state="corroborated")
        await client.command("register_embedding_space", {
            "scope_id": SYSTEM_SCOPE, "space": msgspec.to_builtins(RIGHT), "actor": ACTOR})

        async def both_ready() -> bool:
            try:
                found = [await client.search(SCOPE, text="build", mode="semantic", space=space.embedding_space_id,
                                             wait_ms=0) for space in (LEFT, RIGHT)]
            except PamspecError as exc:  # the registration is not applied yet: "unknown embedding space"
                assert exc.code == "invalid_request", exc
                return False
            return all(f["index"]["state"] == "ready" for f in found)

        await wait_for(both_ready, timeout=60)
        yield client


@pytest.mark.parametrize("path", _service_vectors(spaces=True))
async def test_invalid_space_vector_is_refused_by_a_service_with_spaces(spaces_client: MemoryClient,
                                                                        path: Path | None) -> None:
    vector = load(path)
    assert path is not None
    with pytest.raises(PamspecError) as caught:
        await SPACE_DRIVERS[path.stem](spaces_client, vector)
    assert caught.value.code == vector["expected_failure"], caught.value
    assert caught.value.retryable is False


async def test_a_vector_naming_no_space_is_read_in_the_default_space(spaces_client: MemoryClient) -> None:
    """vector-without-embedding-space where a default space exists: a vector naming no space is the default
    space's (docs/protocol.md), compared only when it can be one of its vectors, else embedding_space_mismatch."""
    vector = load(pamspec_dir() / "test-vectors" / "invalid" / "vector-without-embedding-space.json")
    with pytest.raises(PamspecError) as caught:
        await spaces_client.search(SCOPE, vector=vector["instance"]["vector"], mode="semantic")
    assert caught.value.code == vector["expected_failure"]
    found = await spaces_client.search(SCOPE, vector=_vector_in(TEST_SPACE, "the build is green"), mode="semantic")
    assert found["embedding_space_id"] == LEFT.embedding_space_id and found["items"]


CREATE_FIELDS = ("object_type", "canonical_content", "actor", "provenance", "schema_id", "lifecycle_state",
                 "retention_state", "validation_state", "observed_at", "asserted_at", "valid_from", "valid_until",
                 "relationship_refs", "integrity", "quality_signals")


def _object_vectors() -> list[Any]:
    return [p for p in _files("test-vectors", "valid") + _files("examples")
            if p.values[0] is None or (p.values[0].stem != "version-chain"
                                       and route(json.loads(p.values[0].read_text())) == "memory-object.schema.json")]


@pytest.mark.parametrize("path", _object_vectors())
async def test_valid_memory_object_vector_is_accepted_by_create(client: MemoryClient, scope: str,
                                                                path: Path | None) -> None:
    vector = load(path)
    if vector["availability_state"] != "available":
        pytest.skip(f"created objects start available; {vector['availability_state']} is reached by "
                    "redact/delete, covered by the story (and partial-redaction by its own test)")
    fields = {k: vector[k] for k in CREATE_FIELDS if k in vector}
    if vector["object_type"] == "tool_result":  # its invocation must exist in the scope first
        invocation = vector["canonical_content"]["invocation_object_id"]
        with contextlib.suppress(PamspecError):  # version_conflict: made already
            await client.create(SCOPE, "tool_invocation", {"tool_name": "t", "arguments": {}}, ACTOR, PROVENANCE,
                                object_id=invocation)
    result = await client.create(SCOPE, **fields)
    envelope = result["envelope"]
    assert_valid("memory-object.schema.json", envelope, str(path))
    for name in ("object_type", "canonical_content", "lifecycle_state", "retention_state", "validation_state",
                 "relationship_refs", "integrity"):
        assert envelope.get(name) == vector.get(name), name


async def test_the_relationship_creation_vector_is_accepted_by_relate(client: MemoryClient, scope: str) -> None:
    vector = load(pamspec_dir() / "test-vectors" / "valid" / "relationship-creation.json")
    source = await client.create(SCOPE, "claim", {"statement": "s"}, ACTOR, PROVENANCE)
    target = await client.create(SCOPE, "artifact", {"uri": "urn:a"}, ACTOR, PROVENANCE)
    made = await client.relate(SCOPE, source["object_id"], target["object_id"], vector["relationship_type"],
                               vector["actor"], vector["provenance"], directionality=vector["directionality"],
                               canonical_content=vector["canonical_content"],
                               validation_state=vector["validation_state"])
    envelope = made["envelope"]
    assert_valid("relationship.schema.json", envelope, "relate")
    assert schema_errors("memory-object.schema.json", envelope)  # a relationship is not a Memory Object
    for name in ("relationship_type", "directionality", "canonical_content", "lifecycle_state", "availability_state",
                 "retention_state", "validation_state", "actor"):
        assert envelope[name] == vector[name], name
    assert {k: v for k, v in envelope["provenance"].items() if k != "recorded_at"} == {
        k: v for k, v in vector["provenance"].items() if k != "recorded_at"}


async def test_the_partial_redaction_vector_is_reached_by_redact(client: MemoryClient, scope: str) -> None:
    vector = load(pamspec_dir() / "test-vectors" / "valid" / "partial-redaction.json")
    made = await client.create(SCOPE, vector["object_type"], {**vector["canonical_content"], "statement": "secret"},
                               vector["actor"], vector["provenance"], validation_state=vector["validation_state"])
    redacted = await client.redact(SCOPE, made["object_id"], made["version_id"], vector["actor"], vector["provenance"],
                                   "gdpr:art17", pointers=["/statement"])
    envelope = redacted["envelope"]
    assert_valid("memory-object.schema.json", envelope, "partial redaction")
    for name in ("object_type", "canonical_content", "lifecycle_state", "availability_state", "retention_state",
                 "validation_state", "sequence"):
        assert envelope[name] == vector[name], name
    assert await client.read(SCOPE, made["object_id"]) == envelope


async def test_tool_memory_and_object_model_events_validate(service: Env, story: dict[str, Any]) -> None:
    """Every event type the story's writes produce is in the ledger, schema-valid, and names the right id: a
    relationship's events carry relationship_id and no object_id; tool memory has its event-only entries."""
    async with await psycopg.AsyncConnection.connect(service.database_url) as conn:
        rows = await (await conn.execute("SELECT object_id, event FROM ledger WHERE scope_id = %s"
                                         " ORDER BY ledger_sequence", (SCOPE,))).fetchall()
    events = [(row[0], json.loads(bytes(row[1]))) for row in rows]
    seen = {event["event_type"] for _, event in events}
    assert seen >= {"object_created", "relationship_created", "relationship_updated", "object_redacted",
                    "availability_transitioned", "working_memory_promoted", "provenance_updated", "tool_invoked",
                    "tool_completed", "lifecycle_transitioned"}, seen
    for column, event in events:
        assert_valid("memory-event.schema.json", event, event["event_type"])
        if event["event_type"].startswith("relationship_"):
            assert "object_id" not in event and event["relationship_id"] == column
    invocation = story["created"]["tool_invocation"]["object_id"]  # other tests here make tool memory too
    assert [e["payload"]["version_id"] for _, e in events if e["event_type"] == "tool_invoked"
            and e["payload"]["object_id"] == invocation] == [story["created"]["tool_invocation"]["version_id"]]
    assert len([e for _, e in events if e["event_type"] == "tool_completed"
                and e["payload"]["invocation_object_id"] == invocation]) == 1


async def test_quality_signals_out_of_range_is_invalid_object(client: MemoryClient, scope: str) -> None:
    vector = load(pamspec_dir() / "test-vectors" / "invalid" / "quality-signals-out-of-range.json")
    with pytest.raises(PamspecError) as caught:
        await client.create(SCOPE, "claim", {"statement": "s"}, ACTOR, PROVENANCE,
                            quality_signals=vector["instance"]["quality_signals"])
    assert caught.value.code == vector["expected_failure"]


async def test_subscription_ledger_entries_and_descriptor_validate(client: MemoryClient, scope: str,
                                                                   service: Env) -> None:
    """[M3] subscription_opened / subscription_closed are schema-valid events; the recorded descriptor is a
    valid Subscription; subscribe errors are valid envelopes."""
    sub = await client.subscribe(scope, ACTOR, after_sequence=0, filter={"event_classes": ["object_created"]})
    await sub.close(reason="done")
    async with await psycopg.AsyncConnection.connect(service.database_url) as conn:
        cur = await conn.execute(
            "SELECT event FROM ledger WHERE event_type IN ('subscription_opened', 'subscription_closed')"
            " AND convert_from(event, 'UTF8') LIKE %s ORDER BY ledger_sequence", (f"%{sub.subscription_id}%",))
        events = [json.loads(bytes(r[0])) for r in await cur.fetchall()]
    assert [e["event_type"] for e in events] == ["subscription_opened", "subscription_closed"]
    for event in events:
        assert_valid("memory-event.schema.json", event, event["event_type"])
    assert_valid("subscription.schema.json", events[0]["payload"]["subscription"], "descriptor")
    with pytest.raises(PamspecError) as err:
        await client.subscription_request("open", {"scope_id": scope, "actor": ACTOR, "after_sequence": -1})
    assert err.value.code == "invalid_request"
