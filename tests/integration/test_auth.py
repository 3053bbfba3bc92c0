"""Authentication and authorization through NATS, with real tokens, grants held in the ledger and auth enforced.

This module's NATS has no users, so that requests without a login, or with a malformed token, reach the
service and its own checks can be seen; where pamledger runs NATS they are refused at login already
(test_nats_auth.py, and test_delegation.py runs its requests through such a server).

Why: memory steers what agents do next, so a forged write or a read across tenants is the worst failure
the service can have. Each denial here goes over the wire, is answered `access_denied` with its rule, and
is recorded as a content-free `access_denied` entry in the system scope; revocations take effect on the
next request without a restart.
"""

from __future__ import annotations

import asyncio
import json
import sys
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

from authz.bootstrap import read_token
from infra.settings import AuthSettings
from pamledger_client.admin import issue_token, parse_grant, put_actor, revoke_actor, revoke_token
from pamledger_client.client import MemoryClient
from pamledger_client.errors import PamspecError
from schemas.canonical import decode_json
from tests.conftest import (ROOT, Env, Servers, admin_client, can_query, enforced_env, fresh_database, fresh_settings,
                            service_environment, serving, token_client, wait_for)

pytestmark = pytest.mark.profile("PAMSPEC-Core", "PAMSPEC-Protocol-Binding")  # docs/implementation-report.md

ALICE = {"actor_id": "actor:agent:alice", "actor_kind": "agent"}
BOB = {"actor_id": "actor:agent:bob", "actor_kind": "agent"}


def prov(actor: dict[str, str]) -> dict[str, Any]:
    return {"provenance_id": f"prov:{uuid.uuid4()}", "actor": actor, "activity": "test"}


@pytest.fixture(scope="module")
def env(servers: Servers, tmp_path_factory: pytest.TempPathFactory) -> Env:
    return enforced_env(servers, tmp_path_factory.mktemp("auth_state"), "auth", denial_burst=3,
                        denial_every_seconds=2.0)


class World:
    def __init__(self, env: Env, admin: MemoryClient, alice: MemoryClient, bob: MemoryClient,
                 anonymous: MemoryClient, tokens: dict[str, dict[str, Any]]):
        self.env, self.admin, self.alice, self.bob, self.anonymous, self.tokens = env, admin, alice, bob, anonymous, tokens


_client = token_client


@pytest.fixture(scope="module")
async def world(env: Env) -> AsyncIterator[World]:
    async with serving(env):
        admin = await admin_client(env)
        for scope in ("team:a:one", "team:b:one"):
            await admin.create_scope(scope)
        await put_actor(admin, ALICE["actor_id"], "agent", [parse_grant("team:a:*=create,read,query,update,"
                                                                        "inspect_history,subscribe,unsubscribe")])
        await put_actor(admin, BOB["actor_id"], "agent", [parse_grant("team:b:*=*")])
        tokens = {"alice": await issue_token(admin, ALICE["actor_id"]),
                  "bob": await issue_token(admin, BOB["actor_id"])}
        alice = await _client(env, tokens["alice"]["token"])
        bob = await _client(env, tokens["bob"]["token"])
        anonymous = await _client(env, None)
        await wait_for(lambda: can_query(alice, "team:a:one"), timeout=10)
        await wait_for(lambda: can_query(bob, "team:b:one"), timeout=10)
        try:
            yield World(env, admin, alice, bob, anonymous, tokens)
        finally:
            for c in (admin, alice, bob, anonymous):
                await c.close()


async def _denied(call: Any, rule: str) -> PamspecError:
    with pytest.raises(PamspecError) as err:
        await call

    assert (err.value.code, err.value.policy_rule_id) == ("access_denied", rule), err.value.envelope()
    return err.value


async def denial_entries(env: Env) -> list[dict[str, Any]]:
    async with await psycopg.AsyncConnection.connect(env.database_url) as conn:
        cur = await conn.execute("SELECT event FROM ledger WHERE event_type = 'access_denied' ORDER BY ledger_sequence")
        return [decode_json(bytes(r[0])) for r in await cur.fetchall()]


async def test_without_a_credential_nothing_is_served(world: World) -> None:
    anonymous = world.anonymous
    await _denied(anonymous.create("team:a:one", "claim", {"text": "x"}, ALICE, prov(ALICE)), "auth.missing_credential")
    await _denied(anonymous.read("team:a:one", "mem:nothing"), "auth.missing_credential")
    await _denied(anonymous.query("team:a:one"), "auth.missing_credential")
    await _denied(anonymous.search("team:a:one", text="x", mode="lexical"), "auth.missing_credential")
    await _denied(anonymous.subscription_request("open", {"scope_id": "team:a:one", "actor": ALICE}),
                  "auth.missing_credential")


async def test_a_bad_token_is_refused_alike_whether_its_id_exists_or_not(world: World) -> None:
    real = world.tokens["alice"]["token"]
    wrong_secret = real[:-4] + ("AAAA" if not real.endswith("AAAA") else "BBBB")
    for token in (wrong_secret, "pam_0123456789abcdef_" + "A" * 43):
        client = await _client(world.env, token)
        try:
            error = await _denied(client.query("team:a:one"), "auth.unknown_credential")
            assert error.message == "the credential is not valid"
        finally:
            await client.close()
    client = await _client(world.env, "not-a-token")
    try:
        await _denied(client.query("team:a:one"), "auth.malformed_credential")
    finally:
        await client.close()


async def test_each_agent_reaches_its_own_scope_only(world: World) -> None:
    alice, bob = world.alice, world.bob
    made = await alice.create("team:a:one", "claim", {"text": "alice's secret plan"}, ALICE, prov(ALICE))
    assert (await alice.read("team:a:one", made["object_id"]))["canonical_content"] == {"text": "alice's secret plan"}
    # Bob holds nothing on team:a: refused before any lookup, so the answer says nothing about the object.
    await _denied(bob.read("team:a:one", made["object_id"]), "authz.scope_not_granted")
    await _denied(bob.read("team:a:one", "mem:does-not-exist"), "authz.scope_not_granted")
    await _denied(bob.history("team:a:one", made["object_id"]), "authz.scope_not_granted")
    await _denied(bob.query("team:a:one"), "authz.scope_not_granted")
    await _denied(bob.search("team:a:one", text="secret", mode="lexical"), "authz.scope_not_granted")
    await _denied(bob.subscription_request("open", {"scope_id": "team:a:one", "actor": BOB}),
                  "authz.scope_not_granted")
    await _denied(bob.create("team:a:one", "claim", {"text": "planted"}, BOB, prov(BOB)), "authz.scope_not_granted")
    # Alice may not delete (not granted), nor write as Bob, nor read the system scope.
    await _denied(alice.delete("team:a:one", made["object_id"], made["version_id"], ALICE, prov(ALICE)),
                  "authz.operation_not_granted")
    await _denied(alice.create("team:a:one", "claim", {"text": "x"}, BOB, prov(BOB)), "authz.actor_mismatch")
    await _denied(alice.create("team:a:one", "claim", {"text": "x"}, {**ALICE, "on_behalf_of_actor_id": "actor:x"},
                               prov(ALICE)), "delegation.not_found")
    await _denied(alice.query("system:pamledger"), "authz.scope_not_granted")
    await _denied(alice.command("open_subscription", {
        "scope_id": "team:a:one", "subscription_id": "sub:forged", "actor": ALICE, "subscription": {}}),
        "authz.internal_only")


async def test_denials_are_recorded_without_content_and_rate_limited(world: World) -> None:
    frank = {"actor_id": "actor:agent:frank", "actor_kind": "agent"}
    await put_actor(world.admin, frank["actor_id"], "agent", [parse_grant("team:b:*=read")])
    issued = await issue_token(world.admin, frank["actor_id"])
    client = await _client(world.env, issued["token"])
    try:
        await wait_for(lambda: _answers_read(client, "team:b:one"), timeout=10)
        for _ in range(8):  # a flood: burst 3 per (caller, rule), one more every 2 s in this module
            await _denied(client.read("team:a:one", "mem:flood-secret"), "authz.scope_not_granted")
        recorded = [e for e in await denial_entries(world.env) if e["actor"]["actor_id"] == frank["actor_id"]]
        assert len(recorded) == 3, recorded
        # once the interval has passed, the next denial is recorded and says how many were left out
        async def counted() -> bool:
            await _denied(client.read("team:a:one", "mem:flood-secret"), "authz.scope_not_granted")
            entries = [e for e in await denial_entries(world.env) if e["actor"]["actor_id"] == frank["actor_id"]]
            return any(e["payload"].get("suppressed", 0) > 0 for e in entries)
        await wait_for(counted, timeout=15, interval=0.25)
    finally:
        await client.close()
    entries = await denial_entries(world.env)
    mine = [e for e in entries if e["actor"]["actor_id"] == frank["actor_id"]]
    first = mine[0]["payload"]
    assert first["requested_scope_id"] == "team:a:one" and first["authenticated"] is True
    assert first["token_id"] == issued["token_id"] and first["request"] == "query.read"
    assert sum(1 + e["payload"].get("suppressed", 0) for e in mine) >= 9  # every denial is accounted for
    for entry in entries:
        assert entry["scope_id"] == "system:pamledger" and entry["event_type"] == "access_denied"
        assert "flood-secret" not in str(entry) and "secret plan" not in str(entry)


async def test_a_subscription_belongs_to_the_actor_that_opened_it(world: World) -> None:
    subscription = await world.alice.subscribe("team:a:one", ALICE)
    try:
        for name, body in (("poll", {"subscription_id": subscription.subscription_id}),
                           ("ack", {"subscription_id": subscription.subscription_id, "ledger_sequence": 1}),
                           ("resume", {"subscription_id": subscription.subscription_id}),
                           ("status", {"subscription_id": subscription.subscription_id}),
                           ("close", {"subscription_id": subscription.subscription_id})):
            await _denied(world.bob.subscription_request(name, body, BOB), "subscription.not_owner")
        # an unknown id is refused the same way: a guess learns nothing
        await _denied(world.bob.subscription_request("status", {"subscription_id": "sub:nobody"}, BOB),
                      "subscription.not_owner")
        status = await world.alice.subscription_request("status", {"subscription_id": subscription.subscription_id})
        assert status["subscription_id"] == subscription.subscription_id
    finally:
        await subscription.close()


async def test_a_revoked_token_stops_working_without_a_restart(world: World) -> None:
    extra = await issue_token(world.admin, ALICE["actor_id"], label="short-lived")
    client = await _client(world.env, extra["token"])
    try:
        await wait_for(lambda: can_query(client, "team:a:one"), timeout=10)
        await revoke_token(world.admin, extra["token_id"])
        await wait_for(lambda: _refused(client.query("team:a:one")), timeout=5)
        await _denied(client.query("team:a:one"), "auth.unknown_credential")
        await world.alice.query("team:a:one")  # the actor's other token still works
    finally:
        await client.close()


async def _refused(call: Any) -> bool:
    try:
        await call
        return False
    except PamspecError as exc:
        return exc.code == "access_denied"


async def test_an_expired_token_is_refused(world: World) -> None:
    expired = await issue_token(world.admin, ALICE["actor_id"], not_after="2020-01-01T00:00:00Z")
    client = await _client(world.env, expired["token"])
    try:
        await wait_for(lambda: _refused_with(client.query("team:a:one"), "auth.expired_credential"), timeout=5)
    finally:
        await client.close()


async def _refused_with(call: Any, rule: str) -> bool:
    try:
        await call
        return False
    except PamspecError as exc:
        return exc.policy_rule_id == rule


async def test_losing_a_grant_closes_the_subscription_at_the_last_delivered_event(world: World) -> None:
    carol = {"actor_id": "actor:agent:carol", "actor_kind": "agent"}
    await put_actor(world.admin, carol["actor_id"], "agent", [parse_grant("team:a:*=create,subscribe,read")])
    issued = await issue_token(world.admin, carol["actor_id"])
    client = await _client(world.env, issued["token"])
    try:
        await wait_for(lambda: _answers_read(client), timeout=10)
        subscription = await client.subscribe("team:a:one", carol, filter={"event_classes": ["object_created"]})
        first = await client.create("team:a:one", "claim", {"text": "before"}, carol, prov(carol))
        events = subscription.__aiter__()
        event = await asyncio.wait_for(events.__anext__(), 30)
        assert event["ledger_sequence"] == first["ledger_sequence"]
        await put_actor(world.admin, carol["actor_id"], "agent", [parse_grant("team:elsewhere=read")])
        # once the change is in effect (within a second: the reads are refused), the next event closes it
        await wait_for(lambda: _refused_with(client.read("team:a:one", "mem:none"), "authz.scope_not_granted"),
                       timeout=5)
        await world.alice.create("team:a:one", "claim", {"text": "after the revocation"}, ALICE, prov(ALICE))
        closing = await asyncio.wait_for(_drain_rest(events, subscription), 30)
        assert closing["reason"] == "access_revoked", closing
        assert closing["last_delivered_sequence"] == first["ledger_sequence"]
    finally:
        await client.close()


async def _answers_read(client: MemoryClient, scope_id: str = "team:a:one") -> bool:
    try:
        await client.read(scope_id, "mem:none")
    except PamspecError as exc:
        return exc.code == "object_not_found"
    return True


async def _drain_rest(events: Any, subscription: Any) -> dict[str, Any]:
    """Events until the gateway ends the subscription; returns its terminal close notice."""
    async for _ in events:
        pass
    assert subscription.closed is not None
    return subscription.closed  # type: ignore[no-any-return]


async def test_a_revoked_actor_loses_every_token(world: World) -> None:
    dave = {"actor_id": "actor:agent:dave", "actor_kind": "agent"}
    await put_actor(world.admin, dave["actor_id"], "agent", [parse_grant("team:b:*=read,query")])
    issued = await issue_token(world.admin, dave["actor_id"])
    client = await _client(world.env, issued["token"])
    try:
        await wait_for(lambda: can_query(client, "team:b:one"), timeout=10)
        await revoke_actor(world.admin, dave["actor_id"])
        await wait_for(lambda: _refused_with(client.query("team:b:one"), "auth.unknown_actor"), timeout=5)
    finally:
        await client.close()


async def test_a_denial_that_cannot_be_recorded_is_not_given_out(servers: Servers, tmp_path: Path) -> None:
    """Audit fails closed: with no writer to record the access_denied entry, the refused request answers
    service_unavailable (retry later), never access_denied."""
    settings = fresh_settings("authclosed", auth=AuthSettings(mode="enforce", admin_token_file=tmp_path / "a.token",
                                                              service_token_file=tmp_path / "s.token"))
    lonely = Env(servers, fresh_database(servers, "authclosed"), settings)
    async with serving(lonely, ready=("query",), roles=("query",)):
        client = await _client(lonely, None)
        try:
            with pytest.raises(PamspecError) as err:
                await client.query("team:a:one")
            assert err.value.code == "service_unavailable", err.value.envelope()
            assert "could not be recorded" in err.value.message
        finally:
            await client.close()


async def _cli(world: World, *args: str, token: str | None) -> tuple[int, Any, str]:
    """`pamledger ARGS` as a subprocess (the service runs in this event loop, so never a blocking run)."""
    extra = {"PAMLEDGER_TOKEN": token} if token else {}
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "pamledger", *args, cwd=ROOT, env=service_environment(world.env, **extra),
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    out, err = await asyncio.wait_for(process.communicate(), 120)
    assert process.returncode is not None
    return process.returncode, json.loads(out) if out.strip() else None, err.decode()


async def test_the_cli_manages_actors_and_tokens(world: World) -> None:
    admin = read_token(Path(str(world.env.settings.auth.admin_token_file)))
    code, added, err = await _cli(world, "actors", "add", "actor:agent:gina", "--grant", "team:a:*=read,query",
                                  "--name", "Gina", token=admin)
    assert code == 0 and added["created"] is True, err
    code, issued, err = await _cli(world, "tokens", "issue", "actor:agent:gina", "--label", "ci", token=admin)
    assert code == 0 and issued["token"].startswith("pam_"), err
    client = await _client(world.env, issued["token"])
    try:
        await wait_for(lambda: can_query(client, "team:a:one"), timeout=10)
        async def listed_tokens() -> Any:  # the list reads the projection: it shows the token a moment later
            _, listed, _ = await _cli(world, "tokens", "list", token=admin)
            return listed if any(t["token_id"] == issued["token_id"] for t in listed["tokens"]) else None
        listed = await wait_for(listed_tokens, timeout=30, interval=0.2)
        mine = [t for t in listed["tokens"] if t["token_id"] == issued["token_id"]]
        assert mine[0]["actor_id"] == "actor:agent:gina" and mine[0]["label"] == "ci"
        assert "token_digest" not in str(listed) and issued["token"] not in str(listed)
        _, actors, _ = await _cli(world, "actors", "list", token=admin)
        gina = [a for a in actors["actors"] if a["actor_id"] == "actor:agent:gina"]
        assert gina[0]["grants"] == [{"scopes": ["team:a:*"], "operations": ["read", "query"]}]
        code, _, err = await _cli(world, "tokens", "revoke", issued["token_id"], token=admin)
        assert code == 0, err
        await wait_for(lambda: _refused_with(client.query("team:a:one"), "auth.unknown_credential"), timeout=5)
    finally:
        await client.close()
    # Without the administrative token, or with a malformed grant, nothing changes.
    code, _, err = await _cli(world, "actors", "add", "actor:agent:hank", "--grant", "team:a:*=read",
                              token=issued["token"])
    assert code != 0 and "access_denied" in err
    code, _, err = await _cli(world, "actors", "add", "actor:agent:hank", "--grant", "team:a:*=obliterate",
                              token=admin)
    assert code != 0 and "invalid_request" in err


async def test_operator_commands_go_through_the_same_grants(world: World) -> None:
    """audit needs inspect_history on its scope; verify, replay and spaces need the system scope; without a
    token nothing runs (these tools read Postgres, so the database credentials stay the outer boundary:
    docs/security.md). The subscriptions listing goes through the gateway: see the test below."""
    alice, admin = world.tokens["alice"]["token"], read_token(Path(str(world.env.settings.auth.admin_token_file)))
    code, out, err = await _cli(world, "audit", "--scope", "team:a:one", "--at", "0", token=alice)
    assert code == 0, (alice[:25], err)
    for args in (("audit", "--scope", "team:b:one", "--at", "0"), ("verify",), ("spaces",),
                 ("replay", "--scope", "team:a:one")):
        code, _, err = await _cli(world, *args, token=alice)
        assert code != 0 and "access_denied" in err, (args, err)
    code, _, err = await _cli(world, "verify", token=admin)
    assert code == 0, err


async def test_an_agent_lists_only_its_own_subscriptions_and_an_administrator_everyones(world: World) -> None:
    """`sub.list` (SDK `subscriptions()`, CLI `pamledger subscriptions`) reads no table from the client: the
    gateway answers with the caller's own subscriptions, everyone's for an administrator."""
    mine = await world.alice.subscribe("team:a:one", ALICE)
    theirs = await world.bob.subscribe("team:b:one", BOB)
    try:
        listed = {s["subscription_id"]: s for s in await world.alice.subscriptions()}
        assert mine.subscription_id in listed and theirs.subscription_id not in listed
        assert {s["actor_id"] for s in listed.values()} == {ALICE["actor_id"]}
        assert listed[mine.subscription_id]["scope_id"] == "team:a:one"
        assert listed[mine.subscription_id]["status"] == "open"
        assert theirs.subscription_id in {s["subscription_id"] for s in await world.bob.subscriptions()}
        admin = read_token(Path(str(world.env.settings.auth.admin_token_file)))
        code, out, err = await _cli(world, "subscriptions", token=admin)
        assert code == 0, err
        assert {mine.subscription_id, theirs.subscription_id} <= {s["subscription_id"] for s in out["subscriptions"]}
        await _denied(world.anonymous.subscriptions(), "auth.missing_credential")
        await mine.close()
        assert mine.subscription_id not in {s["subscription_id"] for s in await world.alice.subscriptions()}
        closed = {s["subscription_id"]: s for s in await world.alice.subscriptions(include_closed=True)}
        assert closed[mine.subscription_id]["status"] != "open" and closed[mine.subscription_id]["closed_at"]
    finally:
        await theirs.close()


async def test_export_needs_read_and_history_of_the_scope_and_import_an_administrator(
        world: World, tmp_path: Path) -> None:
    from pamledger.bundle import export_bundle, import_bundle

    await world.alice.create("team:a:one", "claim", {"statement": "exported"}, ALICE, prov(ALICE))
    bundle = tmp_path / "a.pamb"
    with bundle.open("wb") as out:
        summary = await export_bundle(world.alice, "team:a:one", out)  # alice holds read and inspect_history
    assert summary["counts"]["versions"] >= 1
    with tmp_path.joinpath("b.pamb").open("wb") as out:
        await _denied(export_bundle(world.bob, "team:a:one", out), "authz.scope_not_granted")
    await _denied(import_bundle(world.alice, bundle, ALICE, scope_id="team:a:copy"), "authz.import_needs_administrator")
    with pytest.raises(PamspecError) as reused:  # the administrator is let through, to the writer's own rules
        await import_bundle(world.admin, bundle, await world.admin.me({}), scope_id="team:a:copy")
    assert reused.value.code == "invalid_object" and reused.value.details["rule"] == "version_id_reuse"
