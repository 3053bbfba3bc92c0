"""Snapshot comparison against the real service: two sealed snapshots of one scope, diffed as added, removed
and changed objects, the changed ones with their versions and events in Inspect History's shape."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from pamledger_client.client import MemoryClient, PamspecError
from query.export import PAGE_BYTES
from query.snapshot_diff import FETCH_ROWS
from tests.conftest import ACTOR, PROVENANCE, Env
from tests.integration.test_cli import error_of, run
from tests.integration.test_snapshots import raw

pytestmark = pytest.mark.profile("PAMSPEC-Evaluation")  # partially built, not claimed (docs/implementation-report.md)

SCOPE = "workspace:diff"
OTHER = "workspace:diff-other"


async def claim(client: MemoryClient, text: str) -> dict[str, Any]:
    return await client.create(SCOPE, "claim", {"statement": text}, ACTOR, PROVENANCE)


@pytest.fixture(scope="module")
async def world(client: MemoryClient) -> dict[str, Any]:
    """Seal A; then update one object, create one, delete one, transition one; seal B."""
    await client.create_scope(SCOPE)
    await client.create_scope(OTHER)
    made = {name: await claim(client, f"the {name} claim") for name in ("kept", "updated", "deleted", "moved")}
    a = (await client.snapshot_create(SCOPE, ACTOR))["snapshot"]
    changes = {
        "updated": await client.update(SCOPE, made["updated"]["object_id"], made["updated"]["version_id"],
                                       {"statement": "the updated claim, again"}, ACTOR, PROVENANCE),
        "deleted": await client.delete(SCOPE, made["deleted"]["object_id"], made["deleted"]["version_id"],
                                       ACTOR, PROVENANCE),
        "moved": await client.transition(SCOPE, made["moved"]["object_id"], made["moved"]["version_id"],
                                         "lifecycle", "archived", ACTOR, PROVENANCE),
    }
    made["created"] = await claim(client, "the created claim")
    b = (await client.snapshot_create(SCOPE, ACTOR))["snapshot"]
    return {"made": made, "changes": changes, "a": a, "b": b}


def ids(items: list[dict[str, Any]]) -> list[str]:
    return [i["object_id"] for i in items]


async def test_the_diff_reports_exactly_what_changed_between_the_seals(client: MemoryClient,
                                                                       world: dict[str, Any]) -> None:
    made, changes, a, b = world["made"], world["changes"], world["a"], world["b"]
    diff = await client.snapshot_diff(SCOPE, a["snapshot_id"], b["snapshot_id"])
    assert diff["direction"] == "forward" and diff["truncated"] is False
    assert diff["from"]["snapshot_id"] == a["snapshot_id"] and diff["to"]["snapshot_id"] == b["snapshot_id"]
    assert diff["added"] == [{"object_id": made["created"]["object_id"], "version_id": made["created"]["version_id"]}]
    assert diff["removed"] == []
    changed = {c["object_id"]: c for c in diff["changed"]}
    assert sorted(changed) == sorted(made[k]["object_id"] for k in ("updated", "deleted", "moved"))
    assert ids(diff["changed"]) == sorted(changed)  # object id order
    for name in ("updated", "deleted", "moved"):
        entry = changed[made[name]["object_id"]]
        assert entry["from_version_id"] == made[name]["version_id"]
        assert entry["to_version_id"] == changes[name]["version_id"] and entry["complete"] is True
        assert [v["version_id"] for v in entry["versions"]] == [changes[name]["version_id"]]
        assert [e["ledger_sequence"] for e in entry["events"]] == [changes[name]["ledger_sequence"]]
        # the same versions and events history at B shows past A's watermark, the same bytes
        history = await client.history(SCOPE, made[name]["object_id"], snapshot_id=b["snapshot_id"])
        past = a["ledger_sequence_high_watermark"]
        assert entry["versions"] == [v for v in history["versions"] if v["version_id"] == changes[name]["version_id"]]
        assert entry["events"] == [e for e in history["events"] if e["ledger_sequence"] > past]
    deleted = changed[made["deleted"]["object_id"]]["versions"][0]
    assert deleted["availability_state"] == "deleted"
    assert changed[made["moved"]["object_id"]]["versions"][0]["lifecycle_state"] == "archived"
    assert changed[made["updated"]["object_id"]]["versions"][0]["canonical_content"] == {
        "statement": "the updated claim, again"}
    assert [changed[made[n]["object_id"]]["events"][0]["event"]["event_type"] for n in ("updated", "deleted", "moved")
            ] == ["object_updated", "object_deleted", "lifecycle_transitioned"]


async def test_a_snapshot_against_itself_is_empty(client: MemoryClient, world: dict[str, Any]) -> None:
    for sid in (world["a"]["snapshot_id"], world["b"]["snapshot_id"]):
        diff = await client.snapshot_diff(SCOPE, sid, sid)
        assert (diff["added"], diff["removed"], diff["changed"], diff["truncated"]) == ([], [], [], False)
        assert diff["after_object_id"] is None


async def test_b_against_a_runs_backward_with_added_and_removed_swapped(client: MemoryClient,
                                                                        world: dict[str, Any]) -> None:
    a, b = world["a"]["snapshot_id"], world["b"]["snapshot_id"]
    forward, backward = await client.snapshot_diff(SCOPE, a, b), await client.snapshot_diff(SCOPE, b, a)
    assert backward["direction"] == "backward"
    assert (backward["added"], backward["removed"]) == (forward["removed"], forward["added"])
    assert [(c["object_id"], c["from_version_id"], c["to_version_id"]) for c in backward["changed"]] == [
        (c["object_id"], c["to_version_id"], c["from_version_id"]) for c in forward["changed"]]
    assert [c["versions"] for c in backward["changed"]] == [c["versions"] for c in forward["changed"]]


async def test_named_members_are_compared_as_the_snapshot_names_them(client: MemoryClient,
                                                                      world: dict[str, Any]) -> None:
    made, b = world["made"], world["b"]
    kept, updated = made["kept"]["object_id"], made["updated"]["object_id"]
    named = (await client.snapshot_create(SCOPE, ACTOR, object_ids=[kept, updated],
                                          at=b["ledger_sequence_high_watermark"]))["snapshot"]
    diff = await client.snapshot_diff(SCOPE, named["snapshot_id"], b["snapshot_id"])
    assert sorted(ids(diff["added"])) == sorted(made[k]["object_id"] for k in ("deleted", "moved", "created"))
    assert diff["removed"] == [] and diff["changed"] == []
    diff = await client.snapshot_diff(SCOPE, world["a"]["snapshot_id"], named["snapshot_id"])
    assert sorted(ids(diff["removed"])) == sorted(made[k]["object_id"] for k in ("deleted", "moved"))
    assert ids(diff["changed"]) == [updated] and diff["added"] == []


async def test_pages_of_one_object_walk_the_whole_diff(client: MemoryClient, world: dict[str, Any]) -> None:
    a, b = world["a"]["snapshot_id"], world["b"]["snapshot_id"]
    whole = await client.snapshot_diff(SCOPE, a, b)
    seen: list[str] = []
    after = None
    while True:
        page = await client.snapshot_diff(SCOPE, a, b, after_object_id=after, limit=1)
        seen += ids(page["added"]) + ids(page["removed"]) + ids(page["changed"])
        if not page["truncated"]:
            break
        assert page["after_object_id"] is not None
        after = page["after_object_id"]
    assert sorted(seen) == sorted(ids(whole["added"]) + ids(whole["removed"]) + ids(whole["changed"]))
    assert len(seen) == len(set(seen)) == 4


async def test_unknown_or_another_scopes_snapshot_is_not_found_and_a_bad_request_is_invalid(
        client: MemoryClient, world: dict[str, Any]) -> None:
    a = world["a"]["snapshot_id"]
    elsewhere = (await client.snapshot_create(OTHER, ACTOR))["snapshot"]["snapshot_id"]
    for first, second in ((a, "snap:never"), ("snap:never", a), (a, elsewhere), (elsewhere, a)):
        with pytest.raises(PamspecError) as caught:
            await client.snapshot_diff(SCOPE, first, second)
        assert caught.value.code == "snapshot_not_found", (first, second)
    with pytest.raises(PamspecError) as caught:
        await client.snapshot_diff("workspace:no-such-scope", a, a)
    assert caught.value.code == "scope_not_found"
    for bad in ({"to_scope_id": OTHER}, {"limit": 0}):  # one request names one scope: no second one
        reply = json.loads(await raw(client, "snapshot_diff", {"scope_id": SCOPE, "from_snapshot_id": a,
                                                               "to_snapshot_id": a, **bad}))
        assert reply["error"]["code"] == "invalid_request", bad


async def test_the_cli_diffs_two_snapshots(service: Env, client: MemoryClient, world: dict[str, Any],
                                           tmp_path: Path) -> None:
    a, b = world["a"]["snapshot_id"], world["b"]["snapshot_id"]
    code, diff, err = await run(service, tmp_path, "snapshot", "diff", SCOPE, a, b)
    assert code == 0, err
    assert diff == await client.snapshot_diff(SCOPE, a, b)
    code, page, err = await run(service, tmp_path, "snapshot", "diff", SCOPE, a, b, "--limit", "1")
    assert code == 0 and page["truncated"] is True and page["after_object_id"] is not None, err
    code, _, err = await run(service, tmp_path, "snapshot", "diff", SCOPE, a, "snap:none")
    assert code != 0 and error_of(err)["code"] == "snapshot_not_found"


async def test_content_erased_after_the_seals_is_null_in_the_diff(client: MemoryClient,
                                                                   world: dict[str, Any]) -> None:
    """Erasure wins, as in history: the diff still names the versions, never the erased content."""
    victim = await claim(client, "first words")
    a = (await client.snapshot_create(SCOPE, ACTOR, object_ids=[victim["object_id"]]))["snapshot"]["snapshot_id"]
    second = await client.update(SCOPE, victim["object_id"], victim["version_id"], {"statement": "a secret to forget"},
                                 ACTOR, PROVENANCE)
    b = (await client.snapshot_create(SCOPE, ACTOR, object_ids=[victim["object_id"]]))["snapshot"]["snapshot_id"]
    body = {"scope_id": SCOPE, "from_snapshot_id": a, "to_snapshot_id": b}
    assert b"a secret to forget" in await raw(client, "snapshot_diff", body)
    await client.delete(SCOPE, victim["object_id"], second["version_id"], ACTOR, PROVENANCE)
    reply = await raw(client, "snapshot_diff", body)
    assert b"a secret to forget" not in reply
    result = json.loads(reply)["result"]
    assert [v["version_id"] for v in result["changed"][0]["versions"]] == [second["version_id"]]
    assert result["changed"][0]["versions"][0]["canonical_content"] is None
    assert result["to"]["erased_since_seal"] == 1


async def test_a_diff_of_large_versions_is_paged_within_a_nats_message(client: MemoryClient,
                                                                        world: dict[str, Any]) -> None:
    """Each reply stays within the page's byte bound (PAGE_BYTES) whatever the versions' sizes; an object whose
    delta alone passes it is cut to a prefix in ledger order and says so."""
    big = [await claim(client, f"big {i}") for i in range(3)]
    members = [o["object_id"] for o in big]
    a = (await client.snapshot_create(SCOPE, ACTOR, object_ids=members))["snapshot"]["snapshot_id"]
    for i, made in enumerate(big):
        version = made["version_id"]
        for round_ in range(1 if i else 4):  # the first object four times: its delta alone passes the bound
            text = {"statement": f"{i}{round_}" + "x" * 300_000}
            version = (await client.update(SCOPE, made["object_id"], version, text, ACTOR, PROVENANCE))["version_id"]
    b = (await client.snapshot_create(SCOPE, ACTOR, object_ids=members))["snapshot"]["snapshot_id"]
    body: dict[str, Any] = {"scope_id": SCOPE, "from_snapshot_id": a, "to_snapshot_id": b}
    pages = []
    while True:
        reply = await raw(client, "snapshot_diff", body)
        assert len(reply) < PAGE_BYTES + 4096, len(reply)
        pages.append(json.loads(reply)["result"])
        if not pages[-1]["truncated"]:
            break
        body["after_object_id"] = pages[-1]["after_object_id"]
    changed = {c["object_id"]: c for page in pages for c in page["changed"]}
    assert sorted(changed) == sorted(members) and len(pages) >= 2
    first = changed[big[0]["object_id"]]  # 1.2 MB of versions: first on its page, cut to fit rather than left out
    assert any(page["changed"][0] is first for page in pages)
    assert first["complete"] is False and 1 <= len(first["versions"]) < 4
    assert [v["sequence"] for v in first["versions"]] == list(range(2, 2 + len(first["versions"])))
    kept = [v["version_id"] for v in first["versions"]]
    assert [e["event"]["version_id"] for e in first["events"]] == kept[:len(first["events"])]  # one ledger prefix
    assert all(changed[m]["complete"] and len(changed[m]["versions"]) == 1 for m in members[1:])


async def test_the_mcp_tool_answers_the_same_diff(service: Env, client: MemoryClient, world: dict[str, Any]) -> None:
    from mcp_binding.callers import Caller, Endpoint
    from mcp_binding.calls import call_tool
    from mcp_binding.catalog import Catalog

    a, b = world["a"]["snapshot_id"], world["b"]["snapshot_id"]
    caller = Caller(Endpoint(service.nats_url, service.settings.subject_prefix), None)
    try:
        done = await call_tool(Catalog(), caller, "pamledger.snapshot_diff",
                               {"scope_id": SCOPE, "from_snapshot_id": a, "to_snapshot_id": b})
        assert not done.is_error and done.structured_content == await client.snapshot_diff(SCOPE, a, b)
        refused = await call_tool(Catalog(), caller, "pamledger.snapshot_diff",
                                  {"scope_id": SCOPE, "from_snapshot_id": a, "to_snapshot_id": "snap:never"})
        assert refused.is_error and refused.structured_content["error"]["code"] == "snapshot_not_found"
    finally:
        await caller.close()


async def test_an_object_changed_many_times_shows_every_version_and_event(client: MemoryClient,
                                                                          world: dict[str, Any]) -> None:
    """More versions than one round trip reads (FETCH_ROWS): the rest come through a cursor, all in order."""
    busy = await claim(client, "changes a lot")
    a = (await client.snapshot_create(SCOPE, ACTOR, object_ids=[busy["object_id"]]))["snapshot"]["snapshot_id"]
    versions, version = [], busy["version_id"]
    for i in range(FETCH_ROWS * 2 + 3):
        version = (await client.update(SCOPE, busy["object_id"], version, {"statement": f"change {i}"}, ACTOR,
                                       PROVENANCE))["version_id"]
        versions.append(version)
    b = (await client.snapshot_create(SCOPE, ACTOR, object_ids=[busy["object_id"]]))["snapshot"]["snapshot_id"]
    entry = (await client.snapshot_diff(SCOPE, a, b))["changed"][0]
    assert [v["version_id"] for v in entry["versions"]] == versions and entry["complete"] is True
    assert [e["event"]["version_id"] for e in entry["events"]] == versions
