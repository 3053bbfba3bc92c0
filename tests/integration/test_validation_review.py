"""[H2] Validation needs a reviewer (PAMSPEC 15.5): through NATS, real tokens, auth enforced.

An agent holding create, update and transition but not `validate` cannot make its own words trusted (create
them corroborated, corroborate them by a transition, promote them so, or keep a corroborated state over new
words it writes), so what it writes stays out of the default (trusted) answers until a reviewer corroborates
it; in a scope that separates duties a reviewer cannot corroborate what it wrote itself. Every refusal is
access_denied with its rule id and recorded in the ledger like any denial.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from typing import Any

import pytest

from pamledger_client.admin import issue_token, parse_grant, put_actor
from pamledger_client.client import MemoryClient
from pamledger_client.delegation import grant_delegation
from pamledger_client.errors import PamspecError
from tests.conftest import Env, Servers, admin_client, can_query, enforced_env, serving, token_client, wait_for
from tests.integration.test_auth import denial_entries
from tests.integration.test_auth_binding import at

pytestmark = pytest.mark.profile("PAMSPEC-Core")

OPEN = "team:review:open"  # no policy
STRICT = "team:review:strict"  # validation.separation_of_duties
AGENT = {"actor_id": "actor:agent:writer", "actor_kind": "agent"}
REVIEWER = {"actor_id": "actor:human:reviewer", "actor_kind": "human"}
OTHER = {"actor_id": "actor:human:second", "actor_kind": "human"}
WRITES = "create,read,update,transition,query,promote,relate,inspect_history"


def prov(actor: dict[str, Any]) -> dict[str, Any]:
    return {"provenance_id": f"prov:{uuid.uuid4()}", "actor": actor, "activity": "test"}


class World:
    def __init__(self, env: Env, admin: MemoryClient, clients: dict[str, MemoryClient]):
        self.env, self.admin, self.clients = env, admin, clients


@pytest.fixture(scope="module")
def env(servers: Servers, tmp_path_factory: pytest.TempPathFactory) -> Env:
    return enforced_env(servers, tmp_path_factory.mktemp("review_state"), "review", denial_burst=50)


@pytest.fixture(scope="module")
async def world(env: Env) -> AsyncIterator[World]:
    async with serving(env):
        admin = await admin_client(env)
        await admin.create_scope(OPEN)
        await admin.create_scope(STRICT, policy={"validation": {"separation_of_duties": True}})
        await put_actor(admin, AGENT["actor_id"], "agent", [parse_grant(f"team:review:*={WRITES}")])
        for actor in (REVIEWER, OTHER):
            await put_actor(admin, actor["actor_id"], "human", [parse_grant(f"team:review:*={WRITES},validate")])
        clients = {}
        for name, actor in (("agent", AGENT), ("reviewer", REVIEWER), ("other", OTHER)):
            clients[name] = await token_client(env, (await issue_token(admin, actor["actor_id"]))["token"])
        for client in clients.values():
            await wait_for(lambda c=client: can_query(c, OPEN), timeout=10)
        try:
            yield World(env, admin, clients)
        finally:
            for client in (admin, *clients.values()):
                await client.close()


async def _denied(call: Any, rule: str) -> None:
    with pytest.raises(PamspecError) as err:
        await call
    assert (err.value.code, err.value.policy_rule_id) == ("access_denied", rule), err.value.envelope()


async def _claim(client: MemoryClient, actor: dict[str, Any], scope: str, text: str, **extra: Any) -> dict[str, Any]:
    return await client.create(scope, "claim", {"statement": text}, actor, prov(actor), **extra)


async def _trusted_ids(client: MemoryClient, scope: str) -> set[str]:
    """What a default query answers: active and corroborated only."""
    return {i["envelope"]["object_id"] for i in (await client.query(scope, limit=500))["items"]}


async def test_an_agent_cannot_make_its_own_words_trusted(world: World) -> None:
    agent = world.clients["agent"]
    await _denied(_claim(agent, AGENT, OPEN, "trust me", validation_state="corroborated"), "authz.validate_not_granted")
    made = await _claim(agent, AGENT, OPEN, "the sky is green")
    assert made["version_id"]
    await _denied(agent.transition(OPEN, made["object_id"], made["version_id"], "validation", "corroborated", AGENT,
                                   prov(AGENT)), "authz.validate_not_granted")
    # disputed is a validation state too: a reviewer's to set
    await _denied(agent.transition(OPEN, made["object_id"], made["version_id"], "validation", "disputed", AGENT,
                                   prov(AGENT)), "authz.validate_not_granted")
    assert made["object_id"] not in await _trusted_ids(agent, OPEN)
    rules = [d["payload"].get("policy_rule_id") or d["payload"].get("rule_id") for d in await denial_entries(world.env)]
    assert rules.count("authz.validate_not_granted") >= 3, rules


async def test_a_reviewer_corroborates_and_new_words_are_unverified_again(world: World) -> None:
    agent, reviewer = world.clients["agent"], world.clients["reviewer"]
    made = await _claim(agent, AGENT, OPEN, "water boils at 100 C at sea level")
    reviewed = await reviewer.transition(OPEN, made["object_id"], made["version_id"], "validation", "corroborated",
                                         REVIEWER, prov(REVIEWER))
    await wait_for(lambda: _has(agent, OPEN, made["object_id"]), timeout=10)
    # The agent rewrites the reviewed claim: its new words are not what was reviewed.
    changed = await agent.update(OPEN, made["object_id"], reviewed["version_id"], {"statement": "water boils at 50 C"},
                                 AGENT, prov(AGENT))
    current = await agent.read(OPEN, made["object_id"])
    assert current["version_id"] == changed["version_id"] and current["validation_state"] == "unverified"
    await wait_for(lambda: _lacks(agent, OPEN, made["object_id"]), timeout=10)
    # A reviewer's own update keeps the state it could have set itself (no separation of duties here).
    again = await reviewer.transition(OPEN, made["object_id"], changed["version_id"], "validation", "corroborated",
                                      REVIEWER, prov(REVIEWER))
    kept = await reviewer.update(OPEN, made["object_id"], again["version_id"], {"statement": "water boils at 100 C"},
                                 REVIEWER, prov(REVIEWER))
    assert (await reviewer.read(OPEN, made["object_id"], kept["version_id"]))["validation_state"] == "corroborated"


async def test_separation_of_duties_keeps_a_reviewer_from_corroborating_its_own_words(world: World) -> None:
    reviewer, other = world.clients["reviewer"], world.clients["other"]
    await _denied(_claim(reviewer, REVIEWER, STRICT, "mine", validation_state="corroborated"),
                  "validation.separation_of_duties")
    made = await _claim(reviewer, REVIEWER, STRICT, "the reviewer's own claim")
    await _denied(reviewer.transition(STRICT, made["object_id"], made["version_id"], "validation", "corroborated",
                                      REVIEWER, prov(REVIEWER)), "validation.separation_of_duties")
    # Disputing is not corroborating: the rule is about making one's own words trusted.
    disputed = await reviewer.transition(STRICT, made["object_id"], made["version_id"], "validation", "disputed",
                                         REVIEWER, prov(REVIEWER))
    done = await other.transition(STRICT, made["object_id"], disputed["version_id"], "validation", "corroborated",
                                  OTHER, prov(OTHER))
    # The second reviewer's transition is the head now, but the words are still the first one's: an update by
    # the second one makes them its own words, which it may not keep corroborated.
    rewritten = await other.update(STRICT, made["object_id"], done["version_id"], {"statement": "rewritten"}, OTHER,
                                   prov(OTHER))
    assert (await other.read(STRICT, made["object_id"], rewritten["version_id"]))["validation_state"] == "unverified"
    await _denied(other.transition(STRICT, made["object_id"], rewritten["version_id"], "validation", "corroborated",
                                   OTHER, prov(OTHER)), "validation.separation_of_duties")
    assert (await reviewer.transition(STRICT, made["object_id"], rewritten["version_id"], "validation",
                                      "corroborated", REVIEWER, prov(REVIEWER)))["version_id"]


async def test_a_delegation_lends_its_grantors_review_power_never_more(world: World) -> None:
    reviewer, agent = world.clients["reviewer"], world.clients["agent"]
    made = await _claim(agent, AGENT, OPEN, "delegated review?")
    # The agent, acting for the reviewer under a delegation of `transition`, corroborates: the reviewer's power.
    granted = await grant_delegation(reviewer, OPEN, REVIEWER, AGENT, ["transition"], "policy:test", at(-1), at(60))
    acting = {**AGENT, "on_behalf_of_actor_id": REVIEWER["actor_id"], "delegation_id": granted["delegation_id"]}
    done = await agent.transition(OPEN, made["object_id"], made["version_id"], "validation", "corroborated", acting,
                                  prov(acting))
    assert done["version_id"]
    # The reviewer acting for the agent (whose grants hold no validate) cannot corroborate in its name.
    other = await _claim(agent, AGENT, OPEN, "reverse delegation")
    back = await grant_delegation(agent, OPEN, AGENT, REVIEWER, ["transition"], "policy:test", at(-1), at(60))
    acting = {**REVIEWER, "on_behalf_of_actor_id": AGENT["actor_id"], "delegation_id": back["delegation_id"]}
    await _denied(reviewer.transition(OPEN, other["object_id"], other["version_id"], "validation", "corroborated",
                                      acting, prov(acting)), "authz.validate_not_granted")


async def _has(client: MemoryClient, scope: str, object_id: str) -> bool:
    return object_id in await _trusted_ids(client, scope)


async def _lacks(client: MemoryClient, scope: str, object_id: str) -> bool:
    return object_id not in await _trusted_ids(client, scope)
