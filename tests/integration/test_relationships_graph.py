"""[M5] The relationship projection and query.related through the real service (auth off): neighbours by type
and direction, hops, limits, gone endpoints, cross-scope targets, default filters, errors, relationship_refs."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import psycopg
import pytest

from pamledger_client.client import MemoryClient, PamspecError
from tests.conftest import ACTOR, PROVENANCE, Env, run_cli, wait_for

pytestmark = pytest.mark.profile("PAMSPEC-Relationship")  # docs/implementation-report.md

SCOPE = "workspace:graph"
OTHER = "workspace:graph.other"


@pytest.fixture(scope="module", autouse=True)
async def scopes(client: MemoryClient) -> None:
    await client.create_scope(SCOPE)
    await client.create_scope(OTHER)


async def claim(client: MemoryClient, text: str, scope: str = SCOPE) -> str:
    made = await client.create(scope, "claim", {"statement": text}, ACTOR, PROVENANCE)
    return str(made["object_id"])


async def relate(client: MemoryClient, source: str, target: str, kind: str = "supports",
                 directionality: str = "directed", **extra: Any) -> dict[str, Any]:
    body = {"scope_id": SCOPE, "source_object_id": source, "target_object_id": target, "relationship_type": kind,
            "directionality": directionality, "actor": ACTOR, "provenance": {**PROVENANCE, "activity": "graph"},
            **extra}
    return await client.command("relate", body)


async def refused(call: Any) -> PamspecError:
    with pytest.raises(PamspecError) as err:
        await call
    return err.value


def neighbours(result: dict[str, Any], hop: int | None = None) -> list[str]:
    return [e["neighbour"]["object_id"] for e in result["edges"] if hop is None or e["hop"] == hop]


async def projected_row(env: Env, relationship_id: str) -> dict[str, Any] | None:
    async with await psycopg.AsyncConnection.connect(env.database_url) as conn:
        cur = await conn.execute("SELECT * FROM current_relationships WHERE relationship_id = %s", (relationship_id,))
        row = await cur.fetchone()
        if row is None:
            return None
        return {d.name: v for d, v in zip(cur.description or [], row)}


async def test_the_projector_keeps_one_row_per_relationship_at_its_latest_version(client: MemoryClient,
                                                                                  service: Env) -> None:
    a, b = await claim(client, "a"), await claim(client, "b")
    made = await relate(client, a, b, canonical_content={"weight": 1})
    rel = made["relationship_id"]
    row = await wait_for(lambda: projected_row(service, rel), timeout=30)
    assert (row["scope_id"], row["source_object_id"], row["target_scope_id"], row["target_object_id"]) == (SCOPE, a, SCOPE, b)
    assert row["relationship_type"] == "supports" and row["directionality"] == "directed"
    assert row["availability_state"] == "available" and row["version_id"] == made["version_id"]
    assert row["ledger_sequence"] == made["ledger_sequence"] and row["sequence"] == 1
    moved = await client.transition(SCOPE, rel, made["version_id"], "lifecycle", "archived", ACTOR, PROVENANCE)

    async def archived() -> bool:
        found = await projected_row(service, rel)
        return found is not None and found["lifecycle_state"] == "archived"
    await wait_for(archived, timeout=30)
    gone = await client.delete(SCOPE, rel, moved["version_id"], ACTOR, PROVENANCE)
    row = await wait_for(lambda: _at(service, rel, gone["ledger_sequence"]), timeout=30)
    assert row["availability_state"] == "deleted" and row["sequence"] == 3
    # the object projection never holds relationships
    async with await psycopg.AsyncConnection.connect(service.database_url) as conn:
        cur = await conn.execute("SELECT count(*) FROM current_objects WHERE object_id = %s", (rel,))
        assert await cur.fetchone() == (0,)


async def _at(env: Env, relationship_id: str, sequence: int) -> dict[str, Any] | None:
    row = await projected_row(env, relationship_id)
    return row if row is not None and row["ledger_sequence"] >= sequence else None


async def test_neighbours_by_direction_and_type(client: MemoryClient) -> None:
    hub, out1, out2, into, both = [await claim(client, f"n{i}") for i in range(5)]
    r1 = await relate(client, hub, out1)
    r2 = await relate(client, hub, out2, "references")
    r3 = await relate(client, into, hub)
    r4 = await relate(client, both, hub, "contradicts", "undirected")
    outgoing = await client.related(SCOPE, hub, direction="outgoing")
    assert neighbours(outgoing) == [both, out2, out1]  # newest first; undirected counts both ways
    assert [e["direction"] for e in outgoing["edges"]] == ["incoming", "outgoing", "outgoing"]
    incoming = await client.related(SCOPE, hub, direction="incoming")
    assert neighbours(incoming) == [both, into]
    everything = await client.related(SCOPE, hub)
    assert [e["relationship"]["relationship_id"] for e in everything["edges"]] == [
        r["relationship_id"] for r in (r4, r3, r2, r1)]
    typed = await client.related(SCOPE, hub, relationship_types=["references", "contradicts"])
    assert neighbours(typed) == [both, out2]
    origin = everything["nodes"][0]
    assert origin["object_id"] == hub and origin["hop"] == 0 and origin["endpoint_state"] == "available"
    assert {n["object_id"] for n in everything["nodes"]} == {hub, out1, out2, into, both}
    assert all(n["envelope"]["canonical_content"]["statement"] for n in everything["nodes"])
    assert everything["truncated"] is False and everything["min_sequence_reached"] is True
    assert everything == await client.related(SCOPE, hub), "the same request over the same state answers the same"


async def test_hops_walk_further_and_the_limit_truncates(client: MemoryClient) -> None:
    chain = [await claim(client, f"chain {i}") for i in range(5)]
    for source, target in zip(chain, chain[1:]):
        await relate(client, source, target, "derives_from")
    one = await client.related(SCOPE, chain[0], direction="outgoing")
    assert neighbours(one) == [chain[1]]
    three = await client.related(SCOPE, chain[0], direction="outgoing", hops=3)
    assert neighbours(three) == chain[1:4] and [e["hop"] for e in three["edges"]] == [1, 2, 3]
    assert [n["hop"] for n in three["nodes"]] == [0, 1, 2, 3]
    middle = await client.related(SCOPE, chain[2], hops=2)  # both ways: two edges per hop, none shown twice
    assert sorted(neighbours(middle, 1)) == sorted([chain[1], chain[3]])
    assert sorted(neighbours(middle, 2)) == sorted([chain[0], chain[4]]) and len(middle["edges"]) == 4
    cut = await client.related(SCOPE, chain[0], direction="outgoing", hops=3, limit=2)
    assert neighbours(cut) == chain[1:3] and cut["truncated"] is True


async def test_a_gone_endpoint_is_said_to_be_gone_and_not_walked_past(client: MemoryClient) -> None:
    a, b, c = await claim(client, "keeps"), await claim(client, "will go"), await claim(client, "behind")
    await relate(client, a, b)
    await relate(client, b, c)
    b_head = await client.read(SCOPE, b)
    await client.delete(SCOPE, b, b_head["version_id"], ACTOR, PROVENANCE)
    found = await client.related(SCOPE, a, direction="outgoing", hops=2)
    assert [(e["neighbour"]["object_id"], e["neighbour"]["endpoint_state"]) for e in found["edges"]] == [(b, "deleted")]
    node = next(n for n in found["nodes"] if n["object_id"] == b)
    assert node["endpoint_state"] == "deleted" and "envelope" not in node
    # from the deleted object itself: its relationships are still its own
    own = await client.related(SCOPE, b, direction="outgoing")
    assert own["nodes"][0]["endpoint_state"] == "deleted" and neighbours(own) == [c]


async def test_only_available_relationships_by_default(client: MemoryClient) -> None:
    a, b, c = await claim(client, "x"), await claim(client, "y"), await claim(client, "z")
    await relate(client, a, b)
    hidden = await relate(client, a, c)
    await client.command("redact", {"scope_id": SCOPE, "object_id": hidden["relationship_id"],
                                    "expected_version_id": hidden["version_id"], "actor": ACTOR,
                                    "provenance": PROVENANCE, "policy_basis": "policy:test-redaction",
                                    "redaction_target": {"erase": True}})
    assert neighbours(await client.related(SCOPE, a)) == [b]
    asked = await client.related(SCOPE, a, availability_states=["available", "redacted"])
    assert sorted(neighbours(asked)) == sorted([b, c])
    redacted = next(e for e in asked["edges"] if e["neighbour"]["object_id"] == c)
    assert redacted["relationship"]["availability_state"] == "redacted"
    assert redacted["relationship"]["canonical_content"] is None


async def test_a_cross_scope_target_is_followed_where_the_caller_may_read(client: MemoryClient) -> None:
    here, there, further = await claim(client, "here"), await claim(client, "there", OTHER), await claim(client, "on", OTHER)
    await relate(client, here, there, target_scope_id=OTHER, policy_basis="policy:shared-evidence")
    await client.command("relate", {"scope_id": OTHER, "source_object_id": there, "target_object_id": further,
                                    "relationship_type": "supports", "directionality": "directed", "actor": ACTOR,
                                    "provenance": PROVENANCE})
    found = await client.related(SCOPE, here, direction="outgoing", hops=2)
    assert [(e["neighbour"]["scope_id"], e["neighbour"]["object_id"]) for e in found["edges"]] == [
        (OTHER, there), (OTHER, further)]
    # incoming, from the other side: the relationship stored in SCOPE points into OTHER
    back = await client.related(OTHER, there, direction="incoming")
    assert [(e["neighbour"]["scope_id"], e["neighbour"]["object_id"]) for e in back["edges"]] == [(SCOPE, here)]


async def test_bad_requests_are_error_envelopes(client: MemoryClient) -> None:
    a = await claim(client, "lonely")
    assert (await refused(client.related("workspace:graph.nowhere", a))).code == "scope_not_found"
    assert (await refused(client.related(SCOPE, "mem:not-here"))).code == "object_not_found"
    assert (await refused(client.related(OTHER, a))).code == "object_not_found"  # lives in another scope
    bad: dict[str, Any]
    for bad in ({"hops": 4}, {"hops": 0}, {"limit": 0}, {"direction": "sideways"}, {"surprise": 1},
                {"relationship_types": []}, {"availability_states": ["gone"]}):
        err = await refused(client.related(SCOPE, a, **bad))
        assert err.code == "invalid_request", bad
    assert (await client.related(SCOPE, a))["edges"] == []


async def test_read_can_carry_relationship_refs_beside_the_unchanged_envelope(client: MemoryClient) -> None:
    a, b, c = await claim(client, "refs a"), await claim(client, "refs b"), await claim(client, "refs c")
    r1, r2 = await relate(client, a, b), await relate(client, c, a)
    plain = await client.read(SCOPE, a)
    await client.related(SCOPE, a)  # refs come from the projection: wait for it (related sends min_sequence)
    both = await client.read_with_relationship_refs(SCOPE, a)
    assert both["envelope"] == plain and "relationship_refs" not in plain
    assert both["relationship_refs"] == sorted([r1["relationship_id"], r2["relationship_id"]])
    assert both["as_of_sequence"] >= r2["ledger_sequence"]


async def test_the_cli_walks_relationships(client: MemoryClient, service: Env) -> None:
    a, b, c = await claim(client, "cli a"), await claim(client, "cli b"), await claim(client, "cli c")
    await relate(client, a, b, "references")
    await relate(client, b, c)
    done = await asyncio.to_thread(run_cli, service, "related", SCOPE, a, "--direction", "outgoing", "--hops", "2",
                                   "--min-sequence", str(client.last_sequence))
    assert done.returncode == 0, done.stderr
    assert neighbours(json.loads(done.stdout)) == [b, c]
    typed = await asyncio.to_thread(run_cli, service, "related", SCOPE, a, "--type", "supports", "--hops", "2")
    assert json.loads(typed.stdout)["edges"] == []
    wrong = await asyncio.to_thread(run_cli, service, "related", SCOPE, a, "--hops", "7")
    assert wrong.returncode != 0
    assert json.loads(wrong.stderr.strip().splitlines()[-1])["error"]["code"] == "invalid_request"
