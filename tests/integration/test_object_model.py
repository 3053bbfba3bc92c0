"""[M5] Relate, Redact, Promote, provenance corrections and tool memory through the real writer (NATS, Postgres)."""

from __future__ import annotations

import json
from typing import Any

import psycopg
import pytest

from command_handler.verify import verify_ledger
from pamledger_client.client import MemoryClient, PamspecError
from tests.conftest import ACTOR, PROVENANCE, Env, pamspec_dir, wait_for

pytestmark = pytest.mark.profile("PAMSPEC-Relationship")  # docs/implementation-report.md

SCOPE = "workspace:objects"
OTHER = "workspace:objects.other"


@pytest.fixture(scope="module", autouse=True)
async def scopes(client: MemoryClient) -> None:
    await client.create_scope(SCOPE)
    await client.create_scope(OTHER)


async def claim(client: MemoryClient, text: str = "water boils at 100 C", scope: str = SCOPE) -> dict[str, Any]:
    return await client.create(scope, "claim", {"statement": text, "detail": {"who": "ana", "n": [1, 2]}},
                               ACTOR, PROVENANCE)


async def refused(call: Any) -> PamspecError:
    with pytest.raises(PamspecError) as err:
        await call
    return err.value


def relate_body(source: str, target: str, **extra: Any) -> dict[str, Any]:
    return {"scope_id": SCOPE, "source_object_id": source, "target_object_id": target,
            "relationship_type": "supports", "directionality": "directed", "actor": ACTOR,
            "provenance": {**PROVENANCE, "activity": "related"}, **extra}


async def ledger_count(service: Env) -> int:
    async with await psycopg.AsyncConnection.connect(service.database_url) as conn:
        row = await (await conn.execute("SELECT count(*) FROM ledger")).fetchone()
        assert row is not None
        return int(row[0])


async def verified(service: Env) -> dict[str, Any]:
    """`pamledger verify`'s answer once the replica has caught up (it checks the head against the stream)."""
    async def ok() -> dict[str, Any] | None:
        report = await verify_ledger(service.database_url, service.nats_url, service.settings.stream_name)
        return report if report["ok"] else None
    return dict(await wait_for(ok, timeout=60))


def schema_validator(name: str) -> Any:
    jsonschema = pytest.importorskip("jsonschema")
    referencing = pytest.importorskip("referencing")
    root = pamspec_dir() / "schemas" / "0.1-draft"
    resources = []
    for path in root.glob("*.json"):
        doc = json.loads(path.read_text())
        resource = referencing.Resource.from_contents(doc)
        resources += [(path.name, resource), (doc["$id"], resource)]
    registry = referencing.Registry().with_resources(resources)
    return jsonschema.Draft202012Validator(json.loads((root / name).read_text()), registry=registry)


async def test_relate_creates_a_versioned_relationship_without_touching_its_endpoints(client: MemoryClient) -> None:
    a, b = await claim(client), await claim(client, "steam is hot")
    made = await client.command("relate", relate_body(a["object_id"], b["object_id"], canonical_content={"weight": 1}))
    envelope = made["envelope"]
    assert made["relationship_id"].startswith("rel:") and made["sequence"] == 1
    assert envelope["relationship_type"] == "supports" and envelope["canonical_content"] == {"weight": 1}
    assert "object_id" not in envelope and envelope["lifecycle_state"] == "active"
    schema_validator("relationship.schema.json").validate(envelope)
    # neither endpoint got a new version
    assert (await client.read(SCOPE, a["object_id"]))["version_id"] == a["version_id"]
    assert (await client.read(SCOPE, b["object_id"]))["version_id"] == b["version_id"]
    updated = await client.command("relate", relate_body(
        a["object_id"], b["object_id"], relationship_id=made["relationship_id"],
        expected_version_id=made["version_id"], canonical_content={"weight": 2}))
    assert updated["sequence"] == 2 and updated["envelope"]["canonical_content"] == {"weight": 2}
    stale = await refused(client.command("relate", relate_body(
        a["object_id"], b["object_id"], relationship_id=made["relationship_id"],
        expected_version_id=made["version_id"])))
    assert stale.code == "version_conflict"
    moved = await refused(client.command("relate", relate_body(
        b["object_id"], a["object_id"], relationship_id=made["relationship_id"],
        expected_version_id=updated["version_id"])))
    assert moved.code == "relationship_conflict"


async def test_relationship_types_vocabulary_and_extensions(client: MemoryClient) -> None:
    a, b = await claim(client), await claim(client)
    kept = await client.command("relate", relate_body(a["object_id"], b["object_id"],
                                                      relationship_type="com.example.cites"))
    assert kept["envelope"]["relationship_type"] == "com.example.cites"
    typo = await refused(client.command("relate", relate_body(a["object_id"], b["object_id"],
                                                              relationship_type="suports")))
    assert typo.code == "invalid_request"


@pytest.mark.parametrize("case, code", [
    ("unknown target", "object_not_found"),
    ("deleted target", "object_deleted"),
    ("self loop", "invalid_request"),
    ("cross scope without basis", "policy_denied"),
    ("target in another scope named as same scope", "object_not_found"),
])
async def test_bad_relationships_write_nothing(client: MemoryClient, service: Env, case: str, code: str) -> None:
    a, b = await claim(client), await claim(client)
    elsewhere = await claim(client, scope=OTHER)
    if case == "deleted target":
        await client.delete(SCOPE, b["object_id"], b["version_id"], ACTOR, PROVENANCE)
    body = {
        "unknown target": relate_body(a["object_id"], "mem:nothing-here"),
        "deleted target": relate_body(a["object_id"], b["object_id"]),
        "self loop": relate_body(a["object_id"], a["object_id"]),
        "cross scope without basis": relate_body(a["object_id"], elsewhere["object_id"], target_scope_id=OTHER),
        "target in another scope named as same scope": relate_body(a["object_id"], elsewhere["object_id"]),
    }[case]
    before = await ledger_count(service)
    assert (await refused(client.command("relate", body))).code == code
    assert await ledger_count(service) == before


async def test_the_ledger_verifies_after_relationships_tool_memory_and_corrections(
        client: MemoryClient, service: Env) -> None:
    await test_tool_memory_needs_its_invocation(client, service)
    await test_provenance_corrections_never_silently_remove_provenance(client)
    await test_relate_creates_a_versioned_relationship_without_touching_its_endpoints(client)
    await verified(service)


async def test_a_cross_scope_relationship_with_a_policy_basis_is_recorded(client: MemoryClient) -> None:
    a, elsewhere = await claim(client), await claim(client, scope=OTHER)
    made = await client.command("relate", relate_body(a["object_id"], elsewhere["object_id"], target_scope_id=OTHER,
                                                      policy_basis="policy:cross-scope:research"))
    assert made["envelope"]["target_scope_id"] == OTHER
    schema_validator("relationship.schema.json").validate(made["envelope"])


async def test_deleting_an_endpoint_leaves_the_relationship_governed_on_its_own(client: MemoryClient) -> None:
    a, b = await claim(client), await claim(client)
    made = await client.command("relate", relate_body(a["object_id"], b["object_id"]))
    await client.delete(SCOPE, b["object_id"], b["version_id"], ACTOR, PROVENANCE)
    still = await client.read(SCOPE, made["relationship_id"])
    assert still["version_id"] == made["version_id"] and still["availability_state"] == "available"
    moved = await client.transition(SCOPE, made["relationship_id"], made["version_id"], "lifecycle", "deprecated",
                                    ACTOR, PROVENANCE)
    assert moved["envelope"]["lifecycle_state"] == "deprecated" and moved["relationship_id"] == made["relationship_id"]


async def test_partial_redaction_keeps_the_permitted_projection(client: MemoryClient, service: Env) -> None:
    made = await claim(client, "ana was at the clinic")
    redacted = await client.command("redact", {
        "scope_id": SCOPE, "object_id": made["object_id"], "expected_version_id": made["version_id"],
        "actor": ACTOR, "provenance": PROVENANCE, "policy_basis": "gdpr:art17",
        "redaction_target": {"pointers": ["/statement", "/detail/who"]}})
    envelope = redacted["envelope"]
    assert envelope["availability_state"] == "partially_redacted"
    assert envelope["canonical_content"] == {"statement": "[REDACTED]", "detail": {"who": "[REDACTED]", "n": [1, 2]}}
    assert await client.read(SCOPE, made["object_id"]) == envelope
    first = await client.read(SCOPE, made["object_id"], version_id=made["version_id"])
    assert first["canonical_content"] is None  # the earlier version's content is erased
    await verified(service)


@pytest.mark.parametrize("pointer", ["/nope", "/detail/n/2", "/detail/n/01", "statement", ""])
async def test_a_pointer_that_does_not_resolve_is_invalid_request(client: MemoryClient, pointer: str) -> None:
    made = await claim(client)
    err = await refused(client.command("redact", {
        "scope_id": SCOPE, "object_id": made["object_id"], "expected_version_id": made["version_id"],
        "actor": ACTOR, "provenance": PROVENANCE, "policy_basis": "p",
        "redaction_target": {"pointers": [pointer]}}))
    assert err.code == "invalid_request"
    assert (await client.read(SCOPE, made["object_id"]))["version_id"] == made["version_id"]


@pytest.mark.parametrize("target", [{"fields": ["/actor/display_name"]}, {"pointers": ["/actor"]}])
async def test_a_redaction_reaches_canonical_content_only(client: MemoryClient, target: dict[str, Any]) -> None:
    """Metadata (actor, provenance) is audit material the hash-chained ledger keeps: a redaction target names
    JSON Pointers into canonical_content and nothing else (docs/security.md, "What a redaction can reach")."""
    made = await client.create(SCOPE, "claim", {"statement": "s"}, {**ACTOR, "display_name": "Ana Example"},
                               PROVENANCE)
    err = await refused(client.command("redact", {
        "scope_id": SCOPE, "object_id": made["object_id"], "expected_version_id": made["version_id"],
        "actor": ACTOR, "provenance": PROVENANCE, "policy_basis": "p", "redaction_target": target}))
    assert err.code == "invalid_request"  # an unknown target field, or a pointer naming nothing in the content
    assert (await client.read(SCOPE, made["object_id"]))["actor"]["display_name"] == "Ana Example"


async def test_suppressed_content_is_restored_erased_content_is_not(client: MemoryClient) -> None:
    kept, gone = await claim(client, "suppress me"), await claim(client, "erase me")
    versions = {}
    for made, erase in ((kept, False), (gone, True)):
        versions[made["object_id"]] = (await client.command("redact", {
            "scope_id": SCOPE, "object_id": made["object_id"], "expected_version_id": made["version_id"],
            "actor": ACTOR, "provenance": PROVENANCE, "policy_basis": "review:hold",
            "redaction_target": {"erase": erase}}))["version_id"]
    no_basis = await refused(client.transition(SCOPE, kept["object_id"], versions[kept["object_id"]],
                                               "availability", "available", ACTOR, PROVENANCE))
    assert no_basis.code == "policy_denied"
    restored = await client.transition(SCOPE, kept["object_id"], versions[kept["object_id"]], "availability",
                                       "available", ACTOR, PROVENANCE, policy_basis="restoration:ticket-7")
    assert restored["envelope"]["canonical_content"]["statement"] == "suppress me"
    err = await refused(client.transition(SCOPE, gone["object_id"], versions[gone["object_id"]], "availability",
                                          "available", ACTOR, PROVENANCE, policy_basis="restoration:ticket-8"))
    assert err.code == "invalid_state_transition"


async def test_legal_hold_blocks_erasing_redaction_but_not_suppression(client: MemoryClient) -> None:
    made = await claim(client)
    held = await client.transition(SCOPE, made["object_id"], made["version_id"], "retention", "legal_hold",
                                   ACTOR, PROVENANCE)
    body = {"scope_id": SCOPE, "object_id": made["object_id"], "expected_version_id": held["version_id"],
            "actor": ACTOR, "provenance": PROVENANCE, "policy_basis": "p"}
    assert (await refused(client.command("redact", body))).code == "legal_hold"
    partial = {**body, "redaction_target": {"pointers": ["/statement"]}}
    assert (await refused(client.command("redact", partial))).code == "legal_hold"
    suppressed = await client.command("redact", {**body, "redaction_target": {"erase": False}})
    assert suppressed["envelope"]["availability_state"] == "redacted"


async def test_promote_is_one_atomic_batch_of_four_entries(client: MemoryClient, service: Env) -> None:
    scratch = await client.create(SCOPE, "working_memory", {"task_ref": "task:42", "content": {"note": "db slow"}},
                                  ACTOR, PROVENANCE)
    before = await ledger_count(service)
    promoted = await client.command("promote", {
        "scope_id": SCOPE, "source_object_id": scratch["object_id"], "expected_version_id": scratch["version_id"],
        "target_object_type": "claim", "target_canonical_content": {"statement": "the db is slow"},
        "actor": ACTOR, "provenance": {**PROVENANCE, "activity": "consolidated"}})
    assert await ledger_count(service) == before + 4
    # Read-your-writes covers all four: the reply names the last entry, and the SDK asks for it next.
    assert promoted["through_sequence"] == promoted["ledger_sequence"] + 3 == client.last_sequence
    envelope, links = promoted["envelope"], promoted["promotion"]
    assert envelope["object_type"] == "claim"
    assert envelope["provenance"]["transformation_parent"] == scratch["version_id"]
    source = await client.read(SCOPE, scratch["object_id"])
    assert source["lifecycle_state"] == "superseded" and source["version_id"] == links["source_version_id"]
    relationship = await client.read(SCOPE, links["relationship_id"])
    assert (relationship["relationship_type"], relationship["source_object_id"], relationship["target_object_id"]) \
        == ("derived_from", promoted["object_id"], scratch["object_id"])
    again = await refused(client.command("promote", {
        "scope_id": SCOPE, "source_object_id": scratch["object_id"], "expected_version_id": source["version_id"],
        "target_object_type": "claim", "target_canonical_content": {"statement": "twice"},
        "actor": ACTOR, "provenance": PROVENANCE}))
    assert again.code == "invalid_state_transition"
    await verified(service)  # every stored content (the relationship's too) against its digest


async def test_promoting_anything_but_working_memory_is_invalid_request(client: MemoryClient, service: Env) -> None:
    vector = json.loads((pamspec_dir() / "test-vectors" / "invalid" / "promote-of-non-working-memory.json").read_text())
    made = await claim(client)
    body = {**vector["instance"], "scope_id": SCOPE, "source_object_id": made["object_id"],
            "expected_version_id": made["version_id"]}
    body.pop("operation_id")
    before = await ledger_count(service)
    assert (await refused(client.command("promote", body))).code == vector["expected_failure"]
    assert await ledger_count(service) == before


async def test_provenance_corrections_never_silently_remove_provenance(client: MemoryClient) -> None:
    made = await client.create(SCOPE, "claim", {"statement": "x"}, ACTOR,
                               {**PROVENANCE, "source_ref": "urn:src:1", "evidence_refs": ["urn:e:1"]})
    corrected = {**PROVENANCE, "provenance_id": "prov:corrected", "source_ref": "urn:src:2"}
    body = {"scope_id": SCOPE, "object_id": made["object_id"], "expected_version_id": made["version_id"],
            "actor": ACTOR, "provenance": corrected}
    err = await refused(client.command("correct_provenance", body))
    assert err.code == "invalid_request" and err.details["dropped_fields"] == ["evidence_refs"]
    done = await client.command("correct_provenance", {**body, "removed_fields": ["evidence_refs"]})
    assert done["envelope"]["provenance"]["source_ref"] == "urn:src:2" and done["sequence"] == 2
    assert done["envelope"]["canonical_content"] == {"statement": "x"}


async def test_tool_memory_needs_its_invocation(client: MemoryClient, service: Env) -> None:
    invocation = await client.create(SCOPE, "tool_invocation", {"tool_name": "search", "arguments": {"q": "x"}},
                                     ACTOR, PROVENANCE)
    result = await client.create(SCOPE, "tool_result", {"invocation_object_id": invocation["object_id"],
                                                        "outcome": "success", "result": {"hits": 3}},
                                 ACTOR, PROVENANCE)
    assert result["envelope"]["object_type"] == "tool_result"
    claim_made = await claim(client)
    for wrong in ("mem:no-such-invocation", claim_made["object_id"]):
        err = await refused(client.create(SCOPE, "tool_result", {"invocation_object_id": wrong, "outcome": "error"},
                                          ACTOR, PROVENANCE))
        assert err.code == "invalid_object"
    async with await psycopg.AsyncConnection.connect(service.database_url) as conn:
        rows = await (await conn.execute(
            "SELECT event_type FROM ledger WHERE object_id = ANY(%s) ORDER BY ledger_sequence",
            ([invocation["object_id"], result["object_id"]],))).fetchall()
    assert [r[0] for r in rows] == ["object_created", "tool_invoked", "object_created", "tool_completed"]



async def test_a_scope_minimum_retention_refuses_erasure_until_it_has_passed(client: MemoryClient,
                                                                             service: Env) -> None:
    kept_scope, brief_scope = "workspace:objects.kept30d", "workspace:objects.brief"
    await client.create_scope(kept_scope, policy={"retention": {"minimum_days": 30}})
    await client.create_scope(brief_scope, policy={"retention": {"minimum_days": 0.00002}})  # ~1.7 s
    made = await client.create(kept_scope, "claim", {"statement": "keep me"}, ACTOR, PROVENANCE)
    base = {"scope_id": kept_scope, "object_id": made["object_id"], "expected_version_id": made["version_id"],
            "actor": ACTOR, "provenance": PROVENANCE, "policy_basis": "p"}
    before = await ledger_count(service)
    err = await refused(client.delete(kept_scope, made["object_id"], made["version_id"], ACTOR, PROVENANCE))
    assert err.code == "retention_restriction" and err.details["minimum_days"] == 30
    assert (await refused(client.command("redact", base))).code == "retention_restriction"
    assert (await refused(client.transition(kept_scope, made["object_id"], made["version_id"], "availability",
                                            "redacted", ACTOR, PROVENANCE))).code == "retention_restriction"
    assert await ledger_count(service) == before
    suppressed = await client.command("redact", {**base, "redaction_target": {"erase": False}})
    assert suppressed["envelope"]["availability_state"] == "redacted"
    brief = await client.create(brief_scope, "claim", {"statement": "short"}, ACTOR, PROVENANCE)

    async def deleted() -> bool:
        try:
            await client.delete(brief_scope, brief["object_id"], brief["version_id"], ACTOR, PROVENANCE)
        except PamspecError as exc:
            assert exc.code == "retention_restriction", exc
            return False
        return True
    await wait_for(deleted, timeout=60, interval=0.3)


async def test_an_idempotent_retry_never_shows_content_a_later_redaction_hides(client: MemoryClient) -> None:
    made = await claim(client, "hidden by a suppression")
    moved = await client.transition(SCOPE, made["object_id"], made["version_id"], "validation", "corroborated",
                                    ACTOR, PROVENANCE, idempotency_key="retry:validation")
    await client.command("redact", {
        "scope_id": SCOPE, "object_id": made["object_id"], "expected_version_id": moved["version_id"],
        "actor": ACTOR, "provenance": PROVENANCE, "policy_basis": "p", "redaction_target": {"erase": False}})
    again = await client.transition(SCOPE, made["object_id"], made["version_id"], "validation", "corroborated",
                                    ACTOR, PROVENANCE, idempotency_key="retry:validation")
    assert again["version_id"] == moved["version_id"] and again["envelope"]["canonical_content"] is None


async def test_after_an_erasure_a_key_still_tells_its_request_from_another(client: MemoryClient) -> None:
    made = await client.create(SCOPE, "claim", {"statement": "erased later"}, ACTOR, PROVENANCE,
                               idempotency_key="reuse:1")
    await client.delete(SCOPE, made["object_id"], made["version_id"], ACTOR, PROVENANCE)
    replayed = await client.create(SCOPE, "claim", {"statement": "erased later"}, ACTOR, PROVENANCE,
                                   idempotency_key="reuse:1")
    assert replayed["version_id"] == made["version_id"]
    # the content part is forgotten: the same shape with other content cannot be told apart (replays) ...
    other_content = await client.create(SCOPE, "claim", {"statement": "other"}, ACTOR, PROVENANCE,
                                        idempotency_key="reuse:1")
    assert other_content["version_id"] == made["version_id"]
    # ... but another request under the key is still refused
    err = await refused(client.create(SCOPE, "decision", {"statement": "x"}, ACTOR, PROVENANCE,
                                      idempotency_key="reuse:1"))
    assert err.code == "duplicate_operation"


async def test_a_promote_retry_answers_the_same_links(client: MemoryClient) -> None:
    scratch = await client.create(SCOPE, "working_memory", {"task_ref": "task:retry", "content": 1}, ACTOR, PROVENANCE)
    body = {"scope_id": SCOPE, "source_object_id": scratch["object_id"], "expected_version_id": scratch["version_id"],
            "target_object_type": "summary", "target_canonical_content": {"text": "t"}, "actor": ACTOR,
            "provenance": PROVENANCE, "idempotency_key": "promote:retry"}
    first = await client.command("promote", body)
    again = await client.command("promote", body)
    assert again["promotion"] == first["promotion"] and again["object_id"] == first["object_id"]


async def test_a_query_as_of_a_sequence_lists_memory_objects_only(client: MemoryClient) -> None:
    a, b = await claim(client), await claim(client)
    made = await client.command("relate", relate_body(a["object_id"], b["object_id"]))
    result = await client.query(SCOPE, as_of_sequence=made["ledger_sequence"], lifecycle_states=["active"],
                                validation_states=["unverified"], limit=500)
    ids = {item["envelope"].get("object_id") for item in result["items"]}
    assert a["object_id"] in ids and None not in ids
    assert all("relationship_id" not in item["envelope"] for item in result["items"])


async def test_a_relationship_whose_endpoint_is_gone_can_still_be_updated(client: MemoryClient) -> None:
    a, b = await claim(client), await claim(client)
    made = await client.command("relate", relate_body(a["object_id"], b["object_id"]))
    await client.delete(SCOPE, b["object_id"], b["version_id"], ACTOR, PROVENANCE)
    updated = await client.command("relate", relate_body(
        a["object_id"], b["object_id"], relationship_id=made["relationship_id"],
        expected_version_id=made["version_id"], canonical_content={"note": "target deleted"}))
    assert updated["sequence"] == 2
