"""Reads, queries and subscription requests through the request shell, against the running service.

Why: the policy port is where [M6] decides who may do what, so a Deny plugged in there must answer every
request kind with access_denied before its handler runs; and each request must carry its caller (the
Pam-Actor header, sent by the SDK) into the context the policy and the handler see.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import msgspec
import psycopg
import pytest

from infra.request_shell import ALLOW, AllowAll, Decision, Deny, RequestContext
from pamledger_client.protocol.subjects import query_subject
from pamledger_client.client import MemoryClient, PamspecError
from tests.conftest import ACTOR, PROVENANCE, Env, running_service

SCOPE = "workspace:shell"
MALLORY = {"actor_id": "agent:mallory", "actor_kind": "agent"}
ALICE = {"actor_id": "agent:alice", "actor_kind": "agent"}


class TestPolicy(AllowAll):
    """Denies agent:mallory everything; records every (operation, context) it is asked about."""

    __test__ = False

    def __init__(self) -> None:
        self.asked: list[tuple[str, RequestContext]] = []

    def decide(self, context: RequestContext, operation: str) -> Decision:
        self.asked.append((operation, context))
        return Deny("rule:test:no-mallory") if context.principal.actor_id == MALLORY["actor_id"] else ALLOW

    def seen(self, operation: str) -> list[RequestContext]:
        return [context for asked, context in self.asked if asked == operation]


POLICY = TestPolicy()


@pytest.fixture(scope="module")
async def service(env: Env) -> AsyncIterator[Env]:
    async with running_service(env, policy=POLICY):
        yield env


@pytest.fixture(scope="module")
async def created(client: MemoryClient) -> dict[str, Any]:
    await client.create_scope(SCOPE)
    return await client.create(SCOPE, "claim", {"statement": "shell"}, ACTOR, PROVENANCE)


async def refused(call: Any) -> PamspecError:
    with pytest.raises(PamspecError) as err:
        await call
    return err.value


async def test_a_deny_answers_access_denied_for_a_read_a_query_and_an_open(
        client: MemoryClient, created: dict[str, Any], service: Env) -> None:
    # Each of these would answer otherwise if its handler ran (the object and the scopes do not exist, the
    # history is there).
    calls = {
        "query.read": lambda: client.read(SCOPE, "obj:missing", actor=MALLORY),
        "query.history": lambda: client.history(SCOPE, created["object_id"], actor=MALLORY),
        "query.query": lambda: client.query("workspace:missing", actor=MALLORY),
        "sub.open": lambda: client.subscription_request("open", {
            "scope_id": "workspace:missing", "actor": MALLORY, "delivery": {"mode": "poll"}}, actor=MALLORY),
    }
    for operation, call in calls.items():
        error = await refused(call())
        assert (error.code, error.policy_rule_id) == ("access_denied", "rule:test:no-mallory"), operation
        assert POLICY.seen(operation)[-1].principal.actor_id == MALLORY["actor_id"]
    status = await client.status("gateway")
    assert status["open_subscriptions"] == 0  # the denied open opened nothing


async def test_the_actor_header_reaches_the_context_of_every_request_kind(
        client: MemoryClient, created: dict[str, Any]) -> None:
    alice = MemoryClient(client.nc, client.prefix, actor=ALICE)
    await alice.read(SCOPE, created["object_id"])
    await alice.history(SCOPE, created["object_id"])
    await alice.query(SCOPE, text="shell")
    opened = await alice.subscription_request("open", {"scope_id": SCOPE, "actor": ALICE, "delivery": {"mode": "poll"},
                                                       "operation_id": "op:shell:open"})
    await alice.subscription_request("poll", {"subscription_id": opened["subscription_id"], "wait_ms": 0})
    for operation in ("query.read", "query.history", "query.query", "sub.open", "sub.poll"):
        context = POLICY.seen(operation)[-1]
        assert context.principal.actor_id == ALICE["actor_id"], operation
        assert context.principal.actor_kind == "agent"
    assert POLICY.seen("sub.open")[-1].operation_id == "op:shell:open"
    assert POLICY.seen("query.read")[-1].scope_id == SCOPE
    await alice.subscription_request("close", {"subscription_id": opened["subscription_id"]})


async def test_without_the_header_the_caller_is_anonymous(client: MemoryClient, created: dict[str, Any]) -> None:
    await client.read(SCOPE, created["object_id"])
    assert POLICY.seen("query.read")[-1].anonymous


@pytest.mark.parametrize("subject", ["read", "query", "sub.open"])
async def test_a_malformed_actor_header_is_invalid_request(
        client: MemoryClient, created: dict[str, Any], subject: str) -> None:
    name = subject if subject.startswith("sub.") else None
    target = f"{client.prefix}.{name}" if name else query_subject(client.prefix, subject)
    body = {"scope_id": SCOPE, "object_id": created["object_id"]} if subject == "read" else {"scope_id": SCOPE}
    if name:
        body = {"scope_id": SCOPE, "actor": ALICE, "delivery": {"mode": "poll"}}
    asked = len(POLICY.asked)
    reply = await client.nc.request(target, msgspec.json.encode(body), timeout=10,
                                    headers={"Pam-Actor": '{"actor_id": "not an id", "actor_kind": "agent"}'})
    error = msgspec.json.decode(reply.data)["error"]
    assert error["code"] == "invalid_request"
    assert error["details"]["field"] == "headers/Pam-Actor"
    assert len(POLICY.asked) == asked  # refused before the policy (and the handler)


async def test_a_push_subscription_names_its_actor_on_every_request(
        client: MemoryClient, created: dict[str, Any]) -> None:
    subscription = await client.subscribe(SCOPE, ALICE, after_sequence=0)  # the client itself names no actor
    await subscription.resume()
    await subscription.close()
    for operation in ("sub.open", "sub.resume", "sub.close"):
        assert POLICY.seen(operation)[-1].principal.actor_id == ALICE["actor_id"], operation


async def test_the_writer_asks_the_policy_for_every_command_and_a_deny_writes_nothing(
    client: MemoryClient, created: dict[str, Any], env: Env
) -> None:
    """Commands go through the same policy port: a denied create answers access_denied with the rule and
    appends only the access_denied entry that records the refusal (in the system scope, without content);
    the same command from another caller commits; the policy saw the scope."""
    from pamledger_client.protocol.subjects import command_subject

    body = msgspec.json.encode({"scope_id": SCOPE, "object_type": "claim", "canonical_content": {"n": "denied"},
                                "actor": MALLORY, "provenance": {**PROVENANCE, "actor": MALLORY}})
    subject = command_subject(client.prefix, "create")
    head = (await client.create(SCOPE, "claim", {"n": "probe"}, ACTOR, PROVENANCE))["ledger_sequence"]
    denied = msgspec.json.decode((await client.nc.request(
        subject, body, timeout=10, headers={"Pam-Actor": msgspec.json.encode(MALLORY).decode()})).data)
    assert denied["error"]["code"] == "access_denied", denied
    assert denied["error"]["policy_rule_id"] == "rule:test:no-mallory"
    allowed = msgspec.json.decode((await client.nc.request(
        subject, body, timeout=10, headers={"Pam-Actor": msgspec.json.encode(ALICE).decode()})).data)
    assert allowed["result"]["ledger_sequence"] == head + 2  # the denied one appended its record only
    async with await psycopg.AsyncConnection.connect(env.database_url) as conn:
        cur = await conn.execute("SELECT event_type, scope_id, event FROM ledger WHERE ledger_sequence = %s",
                                 (head + 1,))
        event_type, scope_id, event = await cur.fetchone()
    assert (event_type, scope_id) == ("access_denied", "system:pamledger")
    assert b"denied" not in bytes(event).replace(b"access_denied", b"")  # no content of the refused command
    history = await client.history(SCOPE, allowed["result"]["object_id"])
    assert history["versions"][0]["canonical_content"] == {"n": "denied"}
    contexts = POLICY.seen("cmd.create")
    assert [c.principal.actor_id for c in contexts[-2:]] == [MALLORY["actor_id"], ALICE["actor_id"]]
    assert all(c.scope_id == SCOPE for c in contexts[-2:])


async def test_the_sdk_names_the_caller_of_a_command(client: MemoryClient, created: dict[str, Any]) -> None:
    """Without an actor of its own, the SDK names the command's actor as the caller (Pam-Actor)."""
    await client.create(SCOPE, "claim", {"n": "by alice"}, ALICE, {**PROVENANCE, "actor": ALICE})
    assert POLICY.seen("cmd.create")[-1].principal.actor_id == ALICE["actor_id"]


@pytest.mark.parametrize("op_id", ["bad id", "op:" + "x" * 100_000, "op:a\x00b"])
async def test_the_operation_id_header_is_checked_as_the_writer_checks_it(
    client: MemoryClient, created: dict[str, Any], op_id: str
) -> None:
    """A read with an invalid Pam-Operation-Id is invalid_request naming the header (as a command is), and the
    reply never echoes the bad id; it reaches neither the policy nor the handler."""
    asked = len(POLICY.asked)
    reply = msgspec.json.decode((await client.nc.request(
        query_subject(client.prefix, "read"),
        msgspec.json.encode({"scope_id": SCOPE, "object_id": created["object_id"], "operation_id": "op:good"}),
        timeout=10, headers={"Pam-Operation-Id": op_id})).data)
    assert reply["error"]["code"] == "invalid_request", reply
    assert reply["error"]["details"]["field"] == "headers/Pam-Operation-Id"
    assert reply["error"]["operation_id"] not in (op_id, "")
    assert len(POLICY.asked) == asked


async def test_a_split_batch_asks_the_policy_once_per_command(
    client: MemoryClient, created: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """When a batch fails and is split, its commands are retried as parsed and authorized the first time:
    an auditing or counting policy ([M6]) sees each command once."""
    import asyncio

    from command_handler.store import PostgresLedgerStore

    real_append, failed = PostgresLedgerStore.append, []

    async def append_failing_once(self: PostgresLedgerStore, batch: Any) -> None:
        if len(batch.ledger) > 1 and not failed:
            failed.append(len(batch.ledger))
            raise RuntimeError("injected: the first multi-command batch fails")
        await real_append(self, batch)

    monkeypatch.setattr(PostgresLedgerStore, "append", append_failing_once)
    asked = len(POLICY.seen("cmd.create"))
    made = await asyncio.gather(*(client.create(SCOPE, "claim", {"split": i}, ALICE, {**PROVENANCE, "actor": ALICE})
                                  for i in range(6)))
    assert failed, "the commands never met in one batch: nothing was split"
    assert len({m["object_id"] for m in made}) == 6
    assert len(POLICY.seen("cmd.create")) - asked == 6
