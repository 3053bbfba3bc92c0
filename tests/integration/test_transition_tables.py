"""The section 9.5 transition tables through the real writer (NATS, Postgres): every (dimension, from, to) pair,
its command variants answered as the spec-text oracle of tests/unit/test_transition_tables.py says, nothing
written by a refusal; then, with auth enforced, a policy override by a non-administrator is access_denied and
recorded in the ledger, while an administrator's goes through.

Why beside the unit test: the writer's shell (intake, planner, the registry it loads, the Context it builds
for restorations and partial redactions, the reply) is what clients meet; a table right in the core but
wrong on the wire would pass the unit test alone.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from typing import Any

import psycopg
import pytest

from pamledger_client.admin import issue_token, parse_grant, put_actor
from pamledger_client.client import MemoryClient, PamspecError
from schemas.canonical import decode_json
from tests.conftest import (ACTOR, PROVENANCE, Env, Servers, admin_client, can_query, enforced_env, serving,
                            token_client, wait_for)
from tests.unit.test_transition_tables import DEVIATIONS, PAIRS, VARIANTS, Variant, expected, oracle

pytestmark = pytest.mark.profile("PAMSPEC-Core")  # docs/implementation-report.md

SCOPE = "workspace:tables"
WIRE_VARIANTS = [v for v in VARIANTS if v.admin]  # auth off: every actor may override; the enforced part below


@pytest.fixture(scope="module", autouse=True)
async def scope(client: MemoryClient) -> None:
    await client.create_scope(SCOPE)


async def object_in(client: MemoryClient, dimension: str, state: str) -> dict[str, Any]:
    """A new claim whose `dimension` is in `state`, made the way a client makes it."""
    content = {"statement": "water boils", "who": "ana"}
    if dimension != "availability":
        return await client.create(SCOPE, "claim", content, ACTOR, PROVENANCE, **{f"{dimension}_state": state})
    made = await client.create(SCOPE, "claim", content, ACTOR, PROVENANCE)
    base = {"scope_id": SCOPE, "object_id": made["object_id"], "expected_version_id": made["version_id"],
            "actor": ACTOR, "provenance": PROVENANCE, "policy_basis": "policy:setup"}
    if state == "partially_redacted":
        return await client.command("redact", {**base, "redaction_target": {"pointers": ["/who"], "erase": False}})
    if state == "redacted":  # suppressed, not erased: a restoration has content to bring back
        return await client.command("redact", {**base, "redaction_target": {"erase": False}})
    if state == "deleted":
        return await client.delete(SCOPE, made["object_id"], made["version_id"], ACTOR, PROVENANCE)
    return made


async def attempt(client: MemoryClient, made: dict[str, Any], dimension: str, source: str, target: str,
                  variant: Variant) -> tuple[str, dict[str, Any] | None]:
    """('ok', reply) or (error code, None) for one command variant making source -> target."""
    base: dict[str, Any] = {"scope_id": SCOPE, "object_id": made["object_id"],
                            "expected_version_id": made["version_id"], "actor": ACTOR, "provenance": PROVENANCE}
    try:
        if dimension == "availability" and target == "partially_redacted" and source != target:
            reply = await client.command("redact", {**base, "policy_basis": "policy:redaction",
                                                    "redaction_target": {"pointers": ["/who"], "erase": False}})
        else:
            optional: dict[str, Any] = {"policy_override": True} if variant.override else {}
            if variant.basis:
                optional["policy_basis"] = "policy:test"
            reply = await client.transition(SCOPE, made["object_id"], made["version_id"], dimension, target, ACTOR,
                                            PROVENANCE, **optional)
    except PamspecError as exc:
        return exc.code, None
    return "ok", reply


def _case(pair: tuple[str, str, str]) -> Any:
    reason = DEVIATIONS.get(pair)
    marks = [pytest.mark.xfail(strict=True, raises=AssertionError, reason=reason)] if reason is not None else []
    return pytest.param(*pair, id="-".join(pair), marks=marks)


@pytest.mark.parametrize("dimension, source, target", [_case(p) for p in PAIRS])
async def test_the_writer_answers_every_pair_as_the_spec_tables_say(client: MemoryClient, service: Env,
                                                                    dimension: str, source: str, target: str) -> None:
    made = await object_in(client, dimension, source)
    wanted = dict(zip([v.name for v in VARIANTS], expected(dimension, source, target)))
    for variant in WIRE_VARIANTS:
        code, reply = await attempt(client, made, dimension, source, target, variant)
        assert code == wanted[variant.name], (variant.name, oracle(dimension, source, target))
        if reply is not None:  # moved: the new version is in the target state, and the next variant is moot
            envelope = reply["envelope"]
            assert envelope[f"{dimension}_state"] == target and reply["sequence"] == made["sequence"] + 1
            return
    assert await head_sequence(service, made["object_id"]) == made["sequence"]  # every refusal wrote nothing


async def head_sequence(env: Env, object_id: str) -> int:
    """The object's latest version (read answers object_redacted for a redacted one: ask the version table)."""
    async with await psycopg.AsyncConnection.connect(env.database_url) as conn:
        row = await (await conn.execute("SELECT max(sequence) FROM memory_versions WHERE scope_id = %s"
                                        " AND object_id = %s", (SCOPE, object_id))).fetchone()
        assert row is not None
        return int(row[0])


# ---- auth enforced: an override is an administrator's ------------------------------------------------------
AGENT = {"actor_id": "actor:agent:overrider", "actor_kind": "agent"}
ADMIN = {"actor_id": "actor:pamledger:admin", "actor_kind": "operator"}
TEAM = "team:tables:one"


def _prov(actor: dict[str, str]) -> dict[str, Any]:
    return {"provenance_id": f"prov:{uuid.uuid4()}", "actor": actor, "activity": "test"}


@pytest.fixture(scope="module")
async def enforced(servers: Servers, tmp_path_factory: pytest.TempPathFactory
                   ) -> AsyncIterator[tuple[Env, MemoryClient, MemoryClient]]:
    env = enforced_env(servers, tmp_path_factory.mktemp("tables_auth"), "tablesauth")
    async with serving(env):
        admin = await admin_client(env)
        await admin.create_scope(TEAM)
        await put_actor(admin, AGENT["actor_id"], "agent", [parse_grant(f"{TEAM}=*")])
        agent = await token_client(env, (await issue_token(admin, AGENT["actor_id"]))["token"])
        await wait_for(lambda: can_query(agent, TEAM), timeout=15)
        try:
            yield env, admin, agent
        finally:
            await agent.close()
            await admin.close()


async def denials(env: Env, actor_id: str) -> list[dict[str, Any]]:
    async with await psycopg.AsyncConnection.connect(env.database_url) as conn:
        cur = await conn.execute("SELECT event FROM ledger WHERE event_type = 'access_denied' ORDER BY ledger_sequence")
        return [e for e in (decode_json(bytes(r[0])) for r in await cur.fetchall()) if e["actor"]["actor_id"] == actor_id]


async def test_an_override_by_a_non_administrator_is_access_denied_and_recorded(
        enforced: tuple[Env, MemoryClient, MemoryClient]) -> None:
    env, admin, agent = enforced
    made = await agent.create(TEAM, "claim", {"statement": "s"}, AGENT, _prov(AGENT))
    # the agent holds every operation on the scope: a plain and a qualified move are its own to make
    moved = await agent.transition(TEAM, made["object_id"], made["version_id"], "lifecycle", "deprecated", AGENT,
                                   _prov(AGENT))
    back = await agent.transition(TEAM, made["object_id"], moved["version_id"], "lifecycle", "active", AGENT,
                                  _prov(AGENT), policy_basis="policy:review:7")
    assert back["envelope"]["lifecycle_state"] == "active"
    before = len(await denials(env, AGENT["actor_id"]))
    with pytest.raises(PamspecError) as err:
        await agent.transition(TEAM, made["object_id"], back["version_id"], "lifecycle", "scratch", AGENT,
                               _prov(AGENT), policy_override=True, policy_basis="policy:override:1")
    assert (err.value.code, err.value.policy_rule_id) == ("access_denied", "transition.override_needs_administrator")
    assert (await agent.read(TEAM, made["object_id"]))["version_id"] == back["version_id"]  # nothing moved
    recorded = (await denials(env, AGENT["actor_id"]))[before:]
    assert [(e["scope_id"], e["payload"]["rule_id"], e["payload"]["request"]) for e in recorded] == [
        ("system:pamledger", "transition.override_needs_administrator", "cmd.transition")]
    assert recorded[0]["payload"]["requested_scope_id"] == TEAM
    # the administrator's override of the same move goes through and says so
    done = await admin.transition(TEAM, made["object_id"], back["version_id"], "lifecycle", "scratch", ADMIN,
                                  _prov(ADMIN), policy_override=True, policy_basis="policy:override:1")
    assert done["envelope"]["lifecycle_state"] == "scratch"
