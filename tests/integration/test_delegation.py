"""PAMSPEC-Delegation through NATS with auth enforced and real tokens: grant, check (a counted use), revoke.

Why: a delegation is how one agent lets another act for it without handing over its credential; each rule
(window, operations, objects, uses, revocation, the grantor still holding what it granted) is a way the
confused-deputy gap closes, and usage counting must be exact when delegates race.
"""

from __future__ import annotations

import asyncio
import json
import sys
from collections.abc import AsyncIterator
from datetime import datetime, timedelta, timezone
from typing import Any

import jsonschema
import psycopg
import pytest
from referencing import Registry, Resource

from authz.bootstrap import admin_token_path, read_token
from pamledger_client.admin import issue_token, parse_grant, put_actor
from pamledger_client.client import MemoryClient
from pamledger_client.delegation import check_delegation, grant_delegation, revoke_delegation
from pamledger_client.errors import PamspecError
from schemas.canonical import decode_json
from tests.conftest import ROOT, Env, Servers, admin_client, can_query, locked_env, pamspec_dir, service_environment, serving, wait_for

pytestmark = pytest.mark.profile("PAMSPEC-Delegation")  # docs/implementation-report.md

SCOPE = "team:deleg"
SUPERVISOR = {"actor_id": "actor:agent:supervisor", "actor_kind": "agent"}
WORKER = {"actor_id": "actor:agent:worker-01", "actor_kind": "agent"}
OUTSIDER = {"actor_id": "actor:agent:outsider", "actor_kind": "agent"}


def at(minutes: float) -> str:
    return (datetime.now(timezone.utc) + timedelta(minutes=minutes)).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


class Agents:
    def __init__(self, env: Env, admin: MemoryClient, clients: dict[str, MemoryClient]):
        self.env, self.admin, self.clients = env, admin, clients

    def __getitem__(self, name: str) -> MemoryClient:
        return self.clients[name]


async def _connect(env: Env, token: str, actor: dict[str, str] | None) -> MemoryClient:
    client = await MemoryClient.connect(env.nats_url, env.settings.subject_prefix, token=token, actor=actor)
    client.retries = 0
    return client


@pytest.fixture(scope="module")
async def agents(servers: Servers, tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Agents]:
    """The service with auth enforced on a NATS running the generated users and permissions: every request
    here logs in to NATS with its token and passes both the transport's and the service's checks."""
    async with locked_env(servers, tmp_path_factory.mktemp("deleg_state"), "deleg") as env, serving(env):
        admin = await admin_client(env)
        await admin.create_scope(SCOPE)
        await put_actor(admin, SUPERVISOR["actor_id"], "agent", [parse_grant(f"{SCOPE}=read,query,update,create,inspect_history")])
        await put_actor(admin, WORKER["actor_id"], "agent", [parse_grant("team:elsewhere=read")])
        await put_actor(admin, OUTSIDER["actor_id"], "agent", [parse_grant("team:elsewhere=read")])
        clients = {}
        for name, actor in (("supervisor", SUPERVISOR), ("worker", WORKER), ("outsider", OUTSIDER)):
            clients[name] = await _connect(env, (await issue_token(admin, actor["actor_id"]))["token"], actor)
        await wait_for(lambda: can_query(clients["supervisor"], SCOPE), timeout=10)
        try:
            yield Agents(env, admin, clients)
        finally:
            for c in (admin, *clients.values()):
                await c.close()


async def _refused(call: Any, rule: str, code: str = "access_denied") -> None:
    with pytest.raises(PamspecError) as err:
        await call
    assert (err.value.code, err.value.policy_rule_id) == (code, rule), err.value.envelope()


async def grant(agents: Agents, operations: list[str], **optional: Any) -> dict[str, Any]:
    window = {"not_before": at(-1), "not_after": at(60)}
    window.update({k: optional.pop(k) for k in ("not_before", "not_after") if k in optional})
    return await grant_delegation(agents["supervisor"], SCOPE, SUPERVISOR, WORKER, operations,
                                  "policy:multi-agent-handoff-v1", **window, **optional)


async def entries(env: Env, event_type: str) -> list[dict[str, Any]]:
    async with await psycopg.AsyncConnection.connect(env.database_url) as conn:
        cur = await conn.execute("SELECT event FROM ledger WHERE event_type = %s ORDER BY ledger_sequence",
                                 (event_type,))
        return [decode_json(bytes(r[0])) for r in await cur.fetchall()]


async def test_a_grant_is_a_delegation_object_and_each_check_a_counted_use(agents: Agents) -> None:
    granted = await grant(agents, ["read", "update"], usage_limit=2, granted_object_types=["task"])
    delegation_id = granted["delegation_id"]
    recorded = [e for e in await entries(agents.env, "delegation_granted")
                if e["payload"]["delegation"]["delegation_id"] == delegation_id]
    assert recorded and recorded[0]["payload"]["delegation"] == granted["delegation"]
    schemas = pamspec_dir() / "schemas" / "0.1-draft"
    registry = Registry().with_resources(
        (p.name, Resource.from_contents(json.loads(p.read_text()))) for p in schemas.glob("*.json"))
    jsonschema.Draft202012Validator(json.loads((schemas / "delegation.schema.json").read_text()),
                                    registry=registry).validate(granted["delegation"])
    worker = agents["worker"]
    first = await check_delegation(worker, delegation_id, SCOPE, WORKER["actor_id"], "read", object_type="task")
    assert (first["uses"], first["uses_left"], first["delegation"]) == (1, 1, granted["delegation"])
    await _refused(check_delegation(worker, delegation_id, SCOPE, WORKER["actor_id"], "delete"),
                   "delegation.operation_not_granted")
    await _refused(check_delegation(worker, delegation_id, SCOPE, WORKER["actor_id"], "read", object_type="claim"),
                   "delegation.object_type_not_granted")
    await check_delegation(worker, delegation_id, SCOPE, WORKER["actor_id"], "update")
    await _refused(check_delegation(worker, delegation_id, SCOPE, WORKER["actor_id"], "read"),
                   "delegation.usage_exhausted")
    exercised = [e for e in await entries(agents.env, "delegation_exercised")
                 if e["payload"]["delegation_id"] == delegation_id]
    assert [e["payload"]["use"] for e in exercised] == [1, 2]
    denied = [e for e in await entries(agents.env, "access_denied")
              if e["payload"]["rule_id"].startswith("delegation.")]
    assert {e["payload"]["rule_id"] for e in denied} >= {"delegation.operation_not_granted",
                                                          "delegation.usage_exhausted"}


async def test_usage_is_counted_exactly_when_delegates_race(agents: Agents) -> None:
    granted = await grant(agents, ["read"], usage_limit=5)
    worker = agents["worker"]

    async def one() -> str:
        try:
            await check_delegation(worker, granted["delegation_id"], SCOPE, WORKER["actor_id"], "read")
            return "ok"
        except PamspecError as exc:
            return exc.policy_rule_id or exc.code

    outcomes = await asyncio.gather(*(one() for _ in range(25)))
    assert outcomes.count("ok") == 5 and outcomes.count("delegation.usage_exhausted") == 20, outcomes
    exercised = [e for e in await entries(agents.env, "delegation_exercised")
                 if e["payload"]["delegation_id"] == granted["delegation_id"]]
    assert sorted(e["payload"]["use"] for e in exercised) == [1, 2, 3, 4, 5]


async def test_the_window_is_enforced_and_an_inverted_one_refused(agents: Agents) -> None:
    await _refused(grant(agents, ["read"], not_before=at(10), not_after=at(5)), "delegation.window_inverted",
                   "policy_denied")
    later = await grant(agents, ["read"], not_before=at(30), not_after=at(60))
    past = await grant(agents, ["read"], not_before=at(-60), not_after=at(-30))
    for granted in (later, past):
        await _refused(check_delegation(agents["worker"], granted["delegation_id"], SCOPE, WORKER["actor_id"],
                                        "read"), "delegation.outside_window")


async def test_objects_are_restricted_when_named(agents: Agents) -> None:
    granted = await grant(agents, ["read"], granted_object_ids=["mem:allowed"])
    worker = agents["worker"]
    await check_delegation(worker, granted["delegation_id"], SCOPE, WORKER["actor_id"], "read", object_id="mem:allowed")
    await _refused(check_delegation(worker, granted["delegation_id"], SCOPE, WORKER["actor_id"], "read",
                                    object_id="mem:other"), "delegation.object_not_granted")


async def test_a_revoked_delegation_stops_at_once_and_only_its_grantor_revokes(agents: Agents) -> None:
    granted = await grant(agents, ["read"])
    worker = agents["worker"]
    await check_delegation(worker, granted["delegation_id"], SCOPE, WORKER["actor_id"], "read")
    await _refused(revoke_delegation(worker, SCOPE, granted["delegation_id"]), "delegation.not_grantor")
    await revoke_delegation(agents["supervisor"], SCOPE, granted["delegation_id"])
    await _refused(check_delegation(worker, granted["delegation_id"], SCOPE, WORKER["actor_id"], "read"),
                   "delegation.revoked")
    fixed = await grant(agents, ["read"], revocable=False)
    await _refused(revoke_delegation(agents["supervisor"], SCOPE, fixed["delegation_id"]),
                   "delegation.not_revocable", "policy_denied")


async def test_nobody_grants_what_it_does_not_hold_or_for_someone_else(agents: Agents) -> None:
    await _refused(grant(agents, ["delete"]), "delegation.grantor_lacks_operation")
    # the worker cannot record a grant in the supervisor's name, nor claim to be the supervisor
    await _refused(grant_delegation(agents["worker"], SCOPE, SUPERVISOR, WORKER, ["read"], "policy:x", at(-1), at(60),
                                    actor=WORKER), "delegation.not_grantor")
    await _refused(grant_delegation(agents["worker"], SCOPE, SUPERVISOR, WORKER, ["read"], "policy:x", at(-1), at(60),
                                    actor=SUPERVISOR), "authz.actor_mismatch")
    granted = await grant(agents, ["read"])
    # someone else cannot exercise it, nor check it in the delegate's name
    await _refused(check_delegation(agents["outsider"], granted["delegation_id"], SCOPE, OUTSIDER["actor_id"], "read"),
                   "delegation.actor_mismatch")
    await _refused(check_delegation(agents["outsider"], granted["delegation_id"], SCOPE, WORKER["actor_id"], "read"),
                   "delegation.actor_mismatch")
    await _refused(check_delegation(agents["worker"], "del:unknown", SCOPE, WORKER["actor_id"], "read"),
                   "delegation.not_found")


async def test_a_grantor_that_loses_the_operation_loses_the_delegation(agents: Agents) -> None:
    boss = {"actor_id": "actor:agent:boss", "actor_kind": "agent"}
    await put_actor(agents.admin, boss["actor_id"], "agent", [parse_grant(f"{SCOPE}=read,query")])
    client = await _connect(agents.env, (await issue_token(agents.admin, boss["actor_id"]))["token"], boss)
    try:
        await wait_for(lambda: can_query(client, SCOPE), timeout=10)
        granted = await grant_delegation(client, SCOPE, boss, WORKER, ["read"], "policy:x", at(-1), at(60))
        await check_delegation(agents["worker"], granted["delegation_id"], SCOPE, WORKER["actor_id"], "read")
        await put_actor(agents.admin, boss["actor_id"], "agent", [parse_grant(f"{SCOPE}=query")])
        await wait_for(lambda: _refused_now(client.read(SCOPE, "mem:none")), timeout=5)
        await _refused(check_delegation(agents["worker"], granted["delegation_id"], SCOPE, WORKER["actor_id"], "read"),
                       "delegation.grantor_lacks_operation")
    finally:
        await client.close()


async def _refused_now(call: Any) -> bool:
    try:
        await call
    except PamspecError as exc:
        return exc.code == "access_denied"
    return False


async def test_the_conformance_adapter_works_with_auth_enforced(agents: Agents) -> None:
    """The adapter holds the administrative token: it acts as each harness actor (registering it) and sets up
    the granting actor's grants before a grant, as the upstream suite presumes."""
    admin = read_token(admin_token_path(agents.env.settings))
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "pamledger", "conformance-adapter", cwd=ROOT,
        env=service_environment(agents.env, PAMLEDGER_TOKEN=str(admin)),
        stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.DEVNULL)
    assert process.stdin is not None and process.stdout is not None
    requests = 0

    async def call(operation: str, arguments: dict[str, Any]) -> dict[str, Any]:
        nonlocal requests
        requests += 1
        process.stdin.write(json.dumps({"request_id": f"r{requests}", "operation": operation,
                                        "arguments": arguments}).encode() + b"\n")
        await process.stdin.drain()
        return json.loads(await asyncio.wait_for(process.stdout.readline(), 60))  # type: ignore[union-attr]

    try:
        assert "PAMSPEC-Delegation" in json.loads(await process.stdout.readline())["profiles_supported"]
        scope = "workspace:adapter-auth"
        lead = {"actor_id": "actor:agent:harness-lead", "actor_kind": "agent"}
        made = await call("create", {"scope_id": scope, "object_type": "claim", "canonical_content": {"x": 1},
                                     "actor": lead, "provenance": {"provenance_id": "prov:h", "actor": lead, "activity": "t"}})
        assert "result" in made, made
        assert "result" in await call("read", {"scope_id": scope, "object_id": made["result"]["object_id"]})
        # the admin's query sees what the stand-in wrote (read-your-writes across the adapter's clients)
        found = await call("query", {"scope_id": scope, "validation_state": None})
        assert [e["object_id"] for e in found["result"]] == [made["result"]["object_id"]], found
        opened = await call("subscribe", {"scope_id": scope, "actor": lead, "filter_spec": {}, "after_sequence": 0})
        assert "result" in opened, opened
        polled = await call("poll_subscription", {"subscription_id": opened["result"]["subscription_id"]})
        assert "result" in polled, polled
        helper = {"actor_id": "actor:agent:harness-helper", "actor_kind": "agent"}
        granted = await call("grant_delegation", {
            "scope_id": scope, "granting_actor": {"actor_id": "actor:agent:harness-granter", "actor_kind": "agent"},
            "delegated_actor": helper, "granted_operations": ["read"], "policy_basis": "policy:h",
            "not_before": at(-1), "not_after": at(60), "usage_limit": 1})
        assert "result" in granted, granted
        check = {"delegation_id": granted["result"]["delegation_id"], "scope_id": scope,
                 "delegated_actor_id": helper["actor_id"], "operation": "read"}
        assert "result" in await call("check_delegation", check)
        assert (await call("check_delegation", check))["error"]["code"] == "access_denied"  # usage_limit 1
        assert (await call("revoke_delegation", {"delegation_id": check["delegation_id"]}))["result"] == {}
    finally:
        process.stdin.close()
        await asyncio.wait_for(process.wait(), 30)


async def test_a_delegate_writes_under_the_delegation_and_each_write_is_a_counted_use(agents: Agents) -> None:
    granted = await grant(agents, ["create", "update"], usage_limit=2)
    acting = {**WORKER, "on_behalf_of_actor_id": SUPERVISOR["actor_id"], "delegation_id": granted["delegation_id"]}
    provenance = {"provenance_id": "prov:delegated", "actor": acting, "activity": "handoff"}
    worker = agents["worker"]
    # the worker holds nothing on the scope: without the delegation it may not write there
    await _refused(worker.create(SCOPE, "task", {"title": "x"}, WORKER, {**provenance, "actor": WORKER}),
                   "authz.scope_not_granted")
    made = await worker.create(SCOPE, "task", {"title": "delegated"}, acting, provenance)
    envelope = await agents["supervisor"].read(SCOPE, made["object_id"])
    assert envelope["actor"]["delegation_id"] == granted["delegation_id"]
    assert envelope["provenance"]["actor"]["on_behalf_of_actor_id"] == SUPERVISOR["actor_id"]
    async with await psycopg.AsyncConnection.connect(agents.env.database_url) as conn:
        cur = await conn.execute("SELECT event_type, event FROM ledger WHERE ledger_sequence IN (%s, %s)"
                                 " ORDER BY ledger_sequence", (made["ledger_sequence"] - 1, made["ledger_sequence"]))
        (before_type, before), (after_type, _) = [(t, decode_json(bytes(e))) for t, e in await cur.fetchall()]
    assert (before_type, after_type) == ("delegation_exercised", "object_created")
    assert before["payload"] == {"delegation_id": granted["delegation_id"], "operation": "create", "use": 1,
                                 "object_type": "task"}
    # provenance must name the delegation as well
    with pytest.raises(PamspecError) as err:
        await worker.create(SCOPE, "task", {"title": "y"}, acting, {**provenance, "actor": WORKER})
    assert err.value.code == "invalid_object"
    # the second use, then none left: the third write is refused and writes nothing
    await worker.update(SCOPE, made["object_id"], made["version_id"], {"title": "v2"}, acting, provenance)
    await _refused(worker.create(SCOPE, "task", {"title": "third"}, acting, provenance), "delegation.usage_exhausted")
    # not on behalf of someone else
    other = await grant(agents, ["create"])
    wrong = {**acting, "delegation_id": other["delegation_id"], "on_behalf_of_actor_id": OUTSIDER["actor_id"]}
    await _refused(worker.create(SCOPE, "task", {"title": "z"}, wrong, {**provenance, "actor": wrong}),
                   "delegation.grantor_mismatch")
    # the header of a read without the delegation: the worker's own grants, which do not cover the scope
    await _refused(worker.read(SCOPE, made["object_id"], actor=WORKER), "authz.scope_not_granted")


async def test_a_delegate_reads_under_the_delegation_and_each_read_is_a_counted_use(agents: Agents) -> None:
    """Read, history, query and search name the delegation in the Pam-Actor header; the writer exercises it
    (counted, delegation_exercised) before the query service answers."""
    made = await agents["supervisor"].create(SCOPE, "task", {"title": "shared plan"}, SUPERVISOR,
                                             {"provenance_id": "prov:s", "actor": SUPERVISOR, "activity": "t"})
    note = await agents["supervisor"].create(SCOPE, "claim", {"statement": "a private note"}, SUPERVISOR,
                                             {"provenance_id": "prov:s", "actor": SUPERVISOR, "activity": "t"})
    granted = await grant(agents, ["read", "inspect_history", "query"], usage_limit=4)
    acting = {**WORKER, "on_behalf_of_actor_id": SUPERVISOR["actor_id"], "delegation_id": granted["delegation_id"]}
    worker = agents["worker"]
    read = await worker.read(SCOPE, made["object_id"], actor=acting)
    assert read["canonical_content"] == {"title": "shared plan"}
    assert (await worker.history(SCOPE, made["object_id"], actor=acting))["object_id"] == made["object_id"]
    found = await worker.query(SCOPE, actor=acting, validation_states=["unverified"])
    assert {i["envelope"]["object_id"] for i in found["items"]} >= {made["object_id"], note["object_id"]}
    searched = await worker.search(SCOPE, text="plan", mode="lexical", actor=acting,  # search is a query
                                   filter={"validation_states": ["unverified"]})
    assert [i["object_id"] for i in searched["items"]] == [made["object_id"]]
    await _refused(worker.read(SCOPE, made["object_id"], actor=acting), "delegation.usage_exhausted")
    await _refused(worker.subscription_request("open", {"scope_id": SCOPE, "actor": acting}, acting),
                   "delegation.operation_not_granted")  # a subscription needs `subscribe` delegated
    uses = [e["payload"] for e in await entries(agents.env, "delegation_exercised")
            if e["payload"]["delegation_id"] == granted["delegation_id"]]
    assert [(u["operation"], u["use"]) for u in uses] == [("read", 1), ("inspect_history", 2), ("query", 3),
                                                           ("query", 4)]
    # restricted to one object (and its type): that object only, no query over the whole scope
    narrow = await grant(agents, ["read", "query"], granted_object_ids=[made["object_id"]],
                         granted_object_types=["task"])
    acting = {**acting, "delegation_id": narrow["delegation_id"]}
    await worker.read(SCOPE, made["object_id"], actor=acting)
    await _refused(worker.read(SCOPE, note["object_id"], actor=acting), "delegation.object_not_granted")
    await _refused(worker.query(SCOPE, actor=acting), "delegation.object_not_granted")
    typed = await grant(agents, ["read"], granted_object_types=["task"])
    acting = {**acting, "delegation_id": typed["delegation_id"]}
    await worker.read(SCOPE, made["object_id"], actor=acting)
    await _refused(worker.read(SCOPE, note["object_id"], actor=acting), "delegation.object_type_not_granted")


async def test_verify_checks_the_delegation_rows_against_the_ledger(agents: Agents) -> None:
    """The writer's delegation state is derived: `pamledger verify` folds the ledger's delegation entries and
    names a row that disagrees (uses, revocation, the grant) or a grant without its row. Runs last: it
    tampers with this module's database."""
    from command_handler.verify import verify_tables

    url = agents.env.database_url
    assert (await asyncio.to_thread(verify_tables, url))["ok"] is True
    granted = await grant(agents, ["read"], usage_limit=3)
    await check_delegation(agents["worker"], granted["delegation_id"], SCOPE, WORKER["actor_id"], "read")
    assert (await asyncio.to_thread(verify_tables, url))["ok"] is True
    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
        await conn.execute("UPDATE delegations SET uses = 0 WHERE delegation_id = %s", (granted["delegation_id"],))
        report = await asyncio.to_thread(verify_tables, url)
        assert report["ok"] is False and report["check"] == "delegations.ledger_entries", report
        assert granted["delegation_id"] in report["reason"]
        await conn.execute("DELETE FROM delegations WHERE delegation_id = %s", (granted["delegation_id"],))
        report = await asyncio.to_thread(verify_tables, url)
        assert report["ok"] is False and report["check"] == "delegations.row", report
