"""[H2] Provenance bound to the caller, and status behind a credential: through NATS, real tokens, auth enforced.

Why: a version's provenance is what readers trust about where a memory came from; with any actor nameable
there, an agent could make its own write look like another's (or the administrator's). And status told
anyone on the bus the pids to kill and the positions and failures of every role.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import psycopg
import pytest

from pamledger_client.admin import issue_token, parse_grant, put_actor
from pamledger_client.client import MemoryClient
from pamledger_client.delegation import grant_delegation, revoke_delegation
from pamledger_client.errors import PamspecError
from tests.conftest import Env, Servers, admin_client, can_query, enforced_env, serving, token_client, wait_for
from tests.integration.test_auth import denial_entries

pytestmark = pytest.mark.profile("PAMSPEC-Core", "PAMSPEC-Protocol-Binding")

SCOPE = "team:bind:one"
ALICE = {"actor_id": "actor:agent:alice", "actor_kind": "agent"}
BOB = {"actor_id": "actor:agent:bob", "actor_kind": "agent"}
WORKER = {"actor_id": "actor:agent:worker", "actor_kind": "agent"}
ADMIN = {"actor_id": "actor:pamledger:admin", "actor_kind": "service"}
ROLES = ("writer", "query", "projector", "gateway")


def prov(actor: dict[str, Any]) -> dict[str, Any]:
    return {"provenance_id": f"prov:{uuid.uuid4()}", "actor": actor, "activity": "test"}


def at(minutes: float) -> str:
    return (datetime.now(timezone.utc) + timedelta(minutes=minutes)).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


class World:
    def __init__(self, env: Env, admin: MemoryClient, clients: dict[str, MemoryClient]):
        self.env, self.admin, self.clients = env, admin, clients


@pytest.fixture(scope="module")
def env(servers: Servers, tmp_path_factory: pytest.TempPathFactory) -> Env:
    return enforced_env(servers, tmp_path_factory.mktemp("binding_state"), "binding", denial_burst=50)


@pytest.fixture(scope="module")
async def world(env: Env) -> AsyncIterator[World]:
    async with serving(env):
        admin = await admin_client(env)
        await admin.create_scope(SCOPE)
        await put_actor(admin, ALICE["actor_id"], "agent", [parse_grant(f"{SCOPE}=*")])
        await put_actor(admin, BOB["actor_id"], "agent", [parse_grant(f"{SCOPE}=*")])
        await put_actor(admin, WORKER["actor_id"], "agent", [parse_grant("team:elsewhere=read")])
        clients = {}
        for name, actor in (("alice", ALICE), ("bob", BOB), ("worker", WORKER)):
            clients[name] = await token_client(env, (await issue_token(admin, actor["actor_id"]))["token"])
        clients["nobody"] = await token_client(env, None)
        await wait_for(lambda: can_query(clients["alice"], SCOPE), timeout=10)
        await wait_for(lambda: can_query(clients["bob"], SCOPE), timeout=10)
        try:
            yield World(env, admin, clients)
        finally:
            for client in (admin, *clients.values()):
                await client.close()


async def _denied(call: Any, rule: str) -> PamspecError:
    with pytest.raises(PamspecError) as err:
        await call
    assert (err.value.code, err.value.policy_rule_id) == ("access_denied", rule), err.value.envelope()
    return err.value


# ---- provenance.actor is the caller (or the principal of its delegation) ----------------------------------

async def test_an_agent_naming_another_actor_in_provenance_is_refused_and_the_refusal_recorded(world: World) -> None:
    alice = world.clients["alice"]
    await _denied(alice.create(SCOPE, "claim", {"text": "bob said so"}, ALICE, prov(BOB)),
                  "authz.provenance_actor_mismatch")
    await _denied(alice.create(SCOPE, "claim", {"text": "the admin said so"}, ALICE, prov(ADMIN)),
                  "authz.provenance_actor_mismatch")
    made = await alice.create(SCOPE, "claim", {"text": "mine"}, ALICE, prov(ALICE))
    await _denied(alice.update(SCOPE, made["object_id"], made["version_id"], {"text": "v2"}, ALICE, prov(BOB)),
                  "authz.provenance_actor_mismatch")
    await _denied(alice.transition(SCOPE, made["object_id"], made["version_id"], "validation", "corroborated",
                                   ALICE, prov(BOB)), "authz.provenance_actor_mismatch")
    await _denied(alice.command("correct_provenance", {
        "scope_id": SCOPE, "object_id": made["object_id"], "expected_version_id": made["version_id"],
        "actor": ALICE, "provenance": prov(BOB)}), "authz.provenance_actor_mismatch")
    # nothing was written by the refusals: the object is still at its first version
    assert (await alice.read(SCOPE, made["object_id"]))["version_id"] == made["version_id"]
    recorded = [e["payload"] for e in await denial_entries(world.env)
                if e["payload"].get("rule_id") == "authz.provenance_actor_mismatch"]
    assert {p["request"] for p in recorded} >= {"cmd.create", "cmd.update", "cmd.transition"}, recorded
    assert all(p["authenticated"] and p["requested_scope_id"] == SCOPE for p in recorded), recorded
    # the administrator names itself in both, as `pamledger restore` does
    await world.admin.create(SCOPE, "claim", {"text": "restored"}, ADMIN, prov(ADMIN))


async def test_a_delegate_may_name_its_principal_in_provenance_and_no_one_else(world: World) -> None:
    granted = await grant_delegation(world.clients["alice"], SCOPE, ALICE, WORKER, ["create"],
                                     "policy:binding-test", at(-1), at(60))
    delegation_id = granted["delegation_id"]
    acting = {**WORKER, "on_behalf_of_actor_id": ALICE["actor_id"], "delegation_id": delegation_id}
    worker = world.clients["worker"]
    await _denied(worker.create(SCOPE, "task", {"title": "x"}, acting, prov({**BOB, "delegation_id": delegation_id})),
                  "authz.provenance_actor_mismatch")
    made = await worker.create(SCOPE, "task", {"title": "for alice"}, acting,
                               prov({**ALICE, "delegation_id": delegation_id}))
    envelope = await world.clients["alice"].read(SCOPE, made["object_id"])
    assert envelope["provenance"]["actor"]["actor_id"] == ALICE["actor_id"]


# ---- subscriptions under a delegation -----------------------------------------------------------------------

async def _closed_row(env: Env, subscription_id: str) -> tuple[str, int] | None:
    async with await psycopg.AsyncConnection.connect(env.database_url) as conn:
        cur = await conn.execute("SELECT close_reason, last_delivered_sequence FROM subscriptions"
                                 " WHERE subscription_id = %s AND status <> 'open'", (subscription_id,))
        row = await cur.fetchone()
    return None if row is None else (str(row[0]), int(row[1]))


async def test_a_subscription_opened_under_a_delegation_ends_with_it(world: World) -> None:
    """The worker holds no grant on the scope: under Alice's delegation of `subscribe` it may subscribe
    (the use checked and counted by the writer), receives Alice's writes, and the subscription is closed
    (access_revoked, at its last delivered sequence) once Alice revokes the delegation; a delegation without
    `subscribe` opens nothing."""
    alice, worker = world.clients["alice"], world.clients["worker"]
    reading = await grant_delegation(alice, SCOPE, ALICE, WORKER, ["read"], "policy:sub-test", at(-1), at(60))
    acting = {**WORKER, "on_behalf_of_actor_id": ALICE["actor_id"], "delegation_id": reading["delegation_id"]}
    with pytest.raises(PamspecError) as err:
        await worker.subscribe(SCOPE, acting)
    assert err.value.code == "access_denied", err.value.envelope()
    granted = await grant_delegation(alice, SCOPE, ALICE, WORKER, ["subscribe"], "policy:sub-test", at(-1), at(60))
    acting = {**WORKER, "on_behalf_of_actor_id": ALICE["actor_id"], "delegation_id": granted["delegation_id"]}
    subscription = await worker.subscribe(SCOPE, acting)
    made = await alice.create(SCOPE, "claim", {"text": "for the delegate"}, ALICE, prov(ALICE))

    async def first() -> dict[str, Any]:
        async for event in subscription:
            if event.get("event", {}).get("object_id") == made["object_id"]:
                return dict(event)
        raise AssertionError(f"the subscription ended: {subscription.closed}")
    delivered = await asyncio.wait_for(first(), timeout=15)
    await subscription.resume()  # a follow-up under the delegation's name is the owner's
    revoked = await revoke_delegation(alice, SCOPE, granted["delegation_id"], ALICE)
    row = await wait_for(lambda: _closed_row(world.env, subscription.subscription_id), timeout=15)
    # Closed at what it had delivered: Alice's write, or at most the revocation's own entry (nothing was
    # written to the scope after it).
    assert row[0] == "access_revoked" and delivered["ledger_sequence"] <= row[1] <= revoked["ledger_sequence"], row


# ---- status needs a credential; details need the system scope ---------------------------------------------

async def test_status_answers_no_one_without_a_credential(world: World) -> None:
    for role in ROLES:
        await _denied(world.clients["nobody"].status(role), "auth.missing_credential")
    bad = await token_client(world.env, "pam_0123456789abcdef_" + "A" * 43)
    try:
        await _denied(bad.status("writer"), "auth.unknown_credential")
    finally:
        await bad.close()


async def test_an_agent_sees_health_only_and_the_administrator_everything(world: World) -> None:
    for role in ROLES:
        health = await world.clients["alice"].status(role)
        assert set(health) == {"role", "leader", "ok"} and health["ok"] is True, health
        full = await world.admin.status(role)
        assert set(full) > set(health) and isinstance(full["pid"], int), full
    writer = await world.admin.status("writer")
    assert "ledger_sequence" in writer and writer["role"] == "leader"  # the key the writer always answered with
    assert "feed_sequence" in await world.admin.status("gateway")
    assert "stuck" in await world.admin.status("projector")


async def test_the_operator_cli_status_reports_pids_with_the_admin_token(world: World, tmp_path: Path) -> None:
    from pamledger.cli import _probe

    report = await _probe(world.env.settings, world.env.nats_url, world.env.database_url)
    assert report["caller"]["actor_id"] == ADMIN["actor_id"], report["caller"]
    assert report["writer"]["answers"] and isinstance(report["writer"]["pid"], int), report["writer"]
