"""Every tool and resource of the MCP binding, driven through one ClientSession as a host would drive it.

Run by tests/integration/test_mcp_stdio.py and test_mcp_http.py, so both transports answer the same calls the
same way. Each step checks what the service committed, not only that the call returned.
"""

from __future__ import annotations

import uuid
from typing import Any

import mcp
import pytest

from schemas.profiles import CLAIMED_PROFILES
from tests.integration.mcp_support import call, refused, resource

CLASSES = ["object_created", "object_updated", "validation_transitioned"]  # what writes_and_reads commits
HELPER = {"actor_id": "actor:agent:mcp-helper", "actor_kind": "agent"}


INDEXER_EVENTS = frozenset({"embedding_generated", "index_rebuilt"})  # the indexer appends these when it likes


async def scope_events(session: mcp.ClientSession, scope: str) -> list[dict[str, Any]]:
    """Every ledger event of the scope the tools wrote (the indexer's own entries left out), through the
    binding's own events pages."""
    events: list[dict[str, Any]] = []
    after = 0
    while True:
        page = await call(session, "pamspec.inspect_history", {"scope_id": scope, "after_sequence": after})
        events += [e for e in page["events"] if e["event"]["event_type"] not in INDEXER_EVENTS]
        after = page["last_sequence"]
        if not page["more"]:
            return events


async def writes_and_reads(session: mcp.ClientSession, scope: str, actor: dict[str, str]) -> dict[str, Any]:
    """create (scope, type, content only), its retry, read, update, transition, query (structured and
    semantic), search, history of the object and of the scope."""
    from tests.integration.test_pamspec_conformance import assert_valid

    assert (await call(session, "pamledger.create_scope", {"scope_id": scope}))["scope_id"] == scope
    minimal = {"scope_id": scope, "object_type": "claim", "canonical_content": {"statement": "the kettle is blue"}}
    created = await call(session, "pamspec.create", minimal)
    envelope = created["envelope"]
    assert envelope["actor"] == actor and envelope["provenance"]["actor"] == actor
    assert envelope["provenance"]["activity"] == "mcp.tool_call:pamspec.create"
    assert_valid("provenance.schema.json", envelope["provenance"])
    assert_valid("memory-object.schema.json", envelope)
    before = len(await scope_events(session, scope))
    again = await session.call_tool("pamspec.create", minimal)  # a host retrying a call whose answer it lost
    replayed = dict(again.structured_content or {})
    assert replayed.pop("idempotency_result") == "replayed_original_result"
    assert replayed == created  # the first result again
    assert again.meta and again.meta["pamledger/idempotency_key"].startswith("mcp:")
    assert len(await scope_events(session, scope)) == before  # written once
    read = await call(session, "pamspec.read", {"scope_id": scope, "object_id": created["object_id"]})
    assert read == envelope
    updated = await call(session, "pamspec.update", {
        "scope_id": scope, "object_id": created["object_id"], "expected_version_id": created["version_id"],
        "canonical_content": {"statement": "the kettle is blue and loud"}})
    moved = await call(session, "pamspec.transition", {
        "scope_id": scope, "object_id": created["object_id"], "expected_version_id": updated["version_id"],
        "dimension": "validation", "target_state": "corroborated"})
    assert moved["envelope"]["validation_state"] == "corroborated"
    found = await call(session, "pamspec.query", {"scope_id": scope, "filters": {"object_type": "claim"}})
    assert [i["envelope"]["object_id"] for i in found["items"]] == [created["object_id"]]
    semantic = await call(session, "pamspec.query", {"scope_id": scope, "semantic": {"text": "blue kettle"},
                                                     "limit": 5})
    assert created["object_id"] in [r["envelope"]["object_id"] for r in semantic["items"]]
    lexical = await call(session, "pamledger.search", {"scope_id": scope, "text": "loud", "mode": "lexical"})
    assert [r["envelope"]["object_id"] for r in lexical["items"]] == [created["object_id"]]
    history = await call(session, "pamspec.inspect_history", {"scope_id": scope, "object_id": created["object_id"],
                                                              "event_classes": ["object_updated"]})
    assert len(history["versions"]) == 3
    assert [e["event"]["event_type"] for e in history["events"]] == ["object_updated"]
    events = await scope_events(session, scope)
    sequences = [e["ledger_sequence"] for e in events]
    assert sequences == sorted(sequences) and len(events) >= 3
    later = await call(session, "pamspec.inspect_history", {"scope_id": scope, "after_sequence": sequences[-2]})
    assert [e["ledger_sequence"] for e in later["events"]  # the indexer may have appended its own meanwhile
            if e["event"]["event_type"] not in INDEXER_EVENTS] == sequences[-1:]
    return moved


async def snapshots(session: mcp.ClientSession, scope: str) -> None:
    """pamledger.snapshot_create seals; read at the snapshot answers what it held, before and after a write."""
    first = await call(session, "pamspec.create", {"scope_id": scope, "object_type": "claim",
                                                   "canonical_content": {"statement": "before the snapshot"}})
    sealed = await call(session, "pamledger.snapshot_create", {"scope_id": scope,
                                                               "snapshot": {"snapshot_id": "snap:mcp-1"}})
    assert sealed["snapshot"]["sealed"] is True and sealed["snapshot"]["scope_id"] == scope
    at = {"scope_id": scope, "object_id": first["object_id"], "snapshot_id": "snap:mcp-1"}
    before = await call(session, "pamspec.read", at)
    await call(session, "pamspec.update", {"scope_id": scope, "object_id": first["object_id"],
                                           "expected_version_id": first["version_id"],
                                           "canonical_content": {"statement": "after the snapshot"}})
    assert await call(session, "pamspec.read", at) == before
    pinned = await resource(session, f"pamspec://scope/{scope}/snapshot/snap:mcp-1")
    assert pinned["snapshot"]["snapshot_id"] == "snap:mcp-1" and "items" in pinned
    frozen = await refused(session, "pamledger.snapshot_create", {"scope_id": scope,
                                                                  "snapshot": {"snapshot_id": "snap:mcp-1",
                                                                               "included_object_ids": []}})
    assert frozen["code"] == "invalid_state_transition"
    run = await call(session, "pamledger.eval_start", {"scope_id": scope, "snapshot_id": "snap:mcp-1",
                                                       "evaluation_scope_id": f"{scope}-eval",
                                                       "evaluation_run_id": f"run:{scope}"})
    assert run["evaluation_run"]["scope_id"] == f"{scope}-eval"
    forked = await call(session, "pamspec.read", {"scope_id": f"{scope}-eval", "object_id": first["object_id"]})
    assert "before the snapshot" in str(forked)  # the snapshot's version, read through the evaluation scope
    assert (await call(session, "pamledger.eval_end", {"scope_id": f"{scope}-eval"}))["evaluation_run"]["ended"]
    compared = await call(session, "pamledger.snapshot_diff", {"scope_id": f"{scope}-eval",
                                                                "from_snapshot_id": "snap:mcp-1"})
    assert compared["to"]["evaluation_run_id"] == f"run:{scope}" and compared["changed"] == []  # it wrote nothing


async def object_model(session: mcp.ClientSession, scope: str, first: dict[str, Any]) -> None:
    """relate, related, promote, redact, delete."""
    second = await call(session, "pamspec.create", {"scope_id": scope, "object_type": "claim",
                                                    "canonical_content": {"statement": "kettles boil water"}})
    relation = await call(session, "pamspec.relate", {
        "scope_id": scope, "source_object_id": first["object_id"], "target_object_id": second["object_id"],
        "relationship_type": "supports"})
    assert relation["relationship_id"].startswith("rel:") or relation["relationship_id"]
    around = await call(session, "pamledger.related", {"scope_id": scope, "object_id": first["object_id"]})
    assert second["object_id"] in str(around)
    note = await call(session, "pamspec.create", {"scope_id": scope, "object_type": "working_memory",
                                                  "canonical_content": {"task_ref": "task:kettle", "content": {"note": "maybe descale it"}}})
    promoted = await call(session, "pamspec.promote", {
        "scope_id": scope, "source_object_id": note["object_id"], "expected_version_id": note["version_id"],
        "target_object_type": "claim", "target_canonical_content": {"statement": "descale the kettle"}})
    assert promoted["promotion"]
    redacted = await call(session, "pamspec.redact", {
        "scope_id": scope, "object_id": second["object_id"], "expected_version_id": second["version_id"],
        "policy_basis": "user asked", "redaction_target": {}})
    assert redacted["envelope"]["availability_state"] == "redacted"
    assert (await refused(session, "pamspec.read", {"scope_id": scope, "object_id": second["object_id"],
                                                    "version_id": second["version_id"]}))["code"] == "object_redacted"
    await call(session, "pamspec.delete", {"scope_id": scope, "object_id": first["object_id"],
                                           "expected_version_id": first["version_id"]})
    gone = await refused(session, "pamspec.read", {"scope_id": scope, "object_id": first["object_id"]})
    assert gone["code"] == "object_deleted"


async def subscriptions(session: mcp.ClientSession, scope: str) -> None:
    """subscribe from the start, poll in order with the cursor, unsubscribe, nothing after."""
    opened = await call(session, "pamspec.subscribe", {"scope_id": scope, "start_sequence": 0,
                                                       "filter": {"event_classes": CLASSES}})
    assert opened["start_sequence"] == 0 and opened["subscription_id"]
    first = await call(session, "pamledger.poll", {"subscription_id": opened["subscription_id"], "max_events": 2})
    second = await call(session, "pamledger.poll", {"subscription_id": opened["subscription_id"], "max_events": 50,
                                                    "wait_ms": 0})
    seen = [e["ledger_sequence"] for e in first["events"] + second["events"]]
    assert len(first["events"]) == 2 and seen == sorted(set(seen)), seen  # in order, none twice
    assert len(seen) == 3 and {e["event"]["event_type"] for e in first["events"] + second["events"]} == set(CLASSES)
    assert first["last_delivered_sequence"] == first["events"][-1]["ledger_sequence"]
    await call(session, "pamspec.unsubscribe", {"scope_id": scope, "subscription_id": opened["subscription_id"]})
    await call(session, "pamspec.create", {"scope_id": scope, "object_type": "claim",
                                           "canonical_content": {"statement": f"after close {uuid.uuid4()}"}})
    after = await call(session, "pamledger.poll", {"subscription_id": opened["subscription_id"], "wait_ms": 200})
    assert after["events"] == [] and after["closed"]


async def delegations(session: mcp.ClientSession, scope: str) -> None:
    granted = await call(session, "pamledger.grant_delegation", {
        "scope_id": scope, "delegated_actor": HELPER, "granted_operations": ["read"], "policy_basis": "pairing",
        "not_before": "2026-01-01T00:00:00Z", "not_after": "2099-01-01T00:00:00Z"})
    delegation_id = granted["delegation_id"]
    # Checked by its delegated actor (not us): the writer refuses us as the sender, as an envelope.
    refusal = await refused(session, "pamledger.check_delegation", {
        "scope_id": scope, "delegation_id": delegation_id, "operation": "read", "delegated_actor_id": HELPER["actor_id"]})
    assert refusal["code"] in ("access_denied", "invalid_request")
    revoked = await call(session, "pamledger.revoke_delegation", {"scope_id": scope, "delegation_id": delegation_id})
    assert revoked


async def bad_input(session: mcp.ClientSession, scope: str) -> None:
    """Each refused with invalid_request / invalid_object naming the field, and nothing written."""
    before = len(await scope_events(session, scope))
    base = {"scope_id": scope, "object_type": "claim", "canonical_content": {"statement": "x"}}
    cases = [
        ("pamspec.create", {**base, "host_added": 1}, "invalid_request", "host_added"),
        ("pamspec.create", {**base, "scope_id": 7}, "invalid_request", "scope_id"),
        ("pamspec.update", {k: v for k, v in base.items() if k != "object_type"} | {"object_id": "mem:x"},
         "invalid_request", "expected_version_id"),
        ("pamspec.create", {**base, "canonical_content": {"statement": "a\u0000b"}}, "invalid_object",
         "/canonical_content/statement"),
        ("pamspec.query", {"scope_id": scope, "filters": {"colour": ["blue"]}}, "invalid_request", "filters/colour"),
        ("pamspec.transition", {"scope_id": scope, "object_id": "mem:x", "expected_version_id": "ver:x",
                                "dimension": "mood", "target_state": "happy"}, "invalid_request", "dimension"),
    ]
    for tool, arguments, code, field in cases:
        error = await refused(session, tool, arguments)
        assert error["code"] == code and error["details"].get("field") == field, (tool, error)
    huge = await refused(session, "pamspec.create", {**base, "canonical_content": {"blob": "x" * 2_000_000}})
    assert huge["code"] == "invalid_request" and "limit_bytes" in huge["details"], huge
    unknown = await refused(session, "pamspec.forget_everything", {})
    assert unknown["code"] == "invalid_request" and unknown["details"]["tool"] == "pamspec.forget_everything"
    snapshot = await refused(session, "pamspec.read", {"scope_id": scope, "object_id": "mem:x", "snapshot_id": "snap:x"})
    assert snapshot["code"] == "snapshot_not_found"
    assert len(await scope_events(session, scope)) == before


async def resources(session: mcp.ClientSession, scope: str, actor: dict[str, str], grants: list[Any]) -> None:
    manifest = await resource(session, "pamspec://manifest")
    assert manifest["caller"] == {**actor, "authenticated": True}
    assert manifest["grants"] == grants and manifest["auth"] == "enforced"
    assert manifest["pamspec"]["profiles"] == list(CLAIMED_PROFILES)
    created = await call(session, "pamspec.create", {"scope_id": scope, "object_type": "claim",
                                                     "canonical_content": {"statement": "resource me"}})
    encoded = scope.replace(":", "%3A")
    for uri in (f"pamspec://scope/{scope}/object/{created['object_id']}",
                f"pamspec://scope/{encoded}/object/{created['object_id'].replace(':', '%3A')}",
                f"pamspec://scope/{scope}/object/{created['object_id']}/version/{created['version_id']}"):
        assert await resource(session, uri) == created["envelope"], uri
    page = await resource(session, f"pamspec://scope/{scope}/events?after_sequence={created['ledger_sequence'] - 1}")
    assert page["events"][0]["ledger_sequence"] == created["ledger_sequence"]
    assert "items" in await resource(session, f"pamspec://scope/{scope}")
    templates = await session.list_resource_templates()
    assert {t.uri_template for t in templates.resource_templates} == {
        "pamspec://scope/{scope_id}", "pamspec://scope/{scope_id}/object/{object_id}",
        "pamspec://scope/{scope_id}/object/{object_id}/version/{version_id}", "pamspec://scope/{scope_id}/events",
        "pamspec://scope/{scope_id}/snapshot/{snapshot_id}"}
    with pytest.raises(mcp.MCPError) as missing:
        await session.read_resource(f"pamspec://scope/{scope}/object/mem:{uuid.uuid4()}")
    assert missing.value.error.data["error"]["code"] == "object_not_found"


async def every_tool(session: mcp.ClientSession, scope: str, actor: dict[str, str], grants: list[Any]) -> None:
    listed = {t.name for t in (await session.list_tools()).tools}
    assert len(listed) == 23 and {"pamspec.create", "pamledger.poll", "pamledger.snapshot_create",
                                  "pamledger.snapshot_diff", "pamledger.eval_start", "pamledger.eval_end"} <= listed
    first = await writes_and_reads(session, scope, actor)
    await subscriptions(session, scope)
    await snapshots(session, scope)
    await object_model(session, scope, first)
    await delegations(session, scope)
    await bad_input(session, scope)
    await odd_inputs(session, scope)
    await resources(session, scope, actor, grants)


async def odd_inputs(session: mcp.ClientSession, scope: str) -> None:
    """What a client can get wrong or try on purpose: each an envelope naming it, never a crash."""
    for uri in (f"pamspec://scope/{scope}%00x/object/mem:x", f"pamspec://scope/{scope}/events?after_sequence={2**70}",
                f"pamspec://scope/{scope}/events?after_sequence=-1", f"pamspec://scope/{scope}/object/a%2Fb/version"):
        with pytest.raises(mcp.MCPError) as bad:
            await session.read_resource(uri)
        assert bad.value.error.data["error"]["code"] == "invalid_request", (uri, bad.value.error.data)
    cursor = await refused(session, "pamspec.query", {"scope_id": scope, "cursor": "not-a-cursor"})
    assert cursor["code"] == "invalid_request"
    mine = await refused(session, "pamspec.read", {"scope_id": scope, "object_id": f"mem:{uuid.uuid4()}",
                                                   "operation_id": "op:mine-1"})
    assert (mine["code"], mine["operation_id"]) == ("object_not_found", "op:mine-1")  # carried verbatim
    deep: Any = "x"
    for _ in range(100):  # past the service's 64 levels, within what the SDK's JSON parser takes (about 200)
        deep = {"d": deep}
    too_deep = await refused(session, "pamspec.create", {"scope_id": scope, "object_type": "claim",
                                                         "canonical_content": deep})
    assert too_deep["code"] == "invalid_object" and "64" in too_deep["message"], too_deep
    space = await refused(session, "pamspec.query", {"scope_id": scope, "embedding_space_id": "space:x"})
    assert space["details"]["field"] == "embedding_space_id"
