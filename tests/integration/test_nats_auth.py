"""The transport: a NATS server running the configuration pamledger writes (authz/nats_auth.py) lets an agent
publish only the public requests and receive only on its own inbox; the service works through it; a token
issued or revoked at run time gains or loses its NATS login within seconds.

Why: with an open NATS, a token-checked request is no protection when anyone can read every reply on
`_INBOX.>`, the raw stream or the JetStream API, or join the writer's queue group and answer commands.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import stat
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import nats
import psycopg
import pytest

from authz.bootstrap import read_token
from authz.nats_auth import SERVICE_USER, agent_login, config_path, read_service_login
from infra.endpoints import SERVERS_FILE
from local_servers.nats_server import NatsServer
from pamledger_client.admin import issue_token, parse_grant, put_actor, revoke_token
from pamledger_client.client import MemoryClient
from pamledger_client.errors import PamspecError
from subscriptions.gateway import REVOCATION_SWEEP_SECONDS
from tests.conftest import Env, Servers, answers, locked_env, serving, wait_for

ALICE = {"actor_id": "actor:agent:alice", "actor_kind": "agent"}
BOB = {"actor_id": "actor:agent:bob", "actor_kind": "agent"}
SCOPE = "team:a:one"


def prov(actor: dict[str, str]) -> dict[str, Any]:
    return {"provenance_id": f"prov:{uuid.uuid4()}", "actor": actor, "activity": "test"}


class World:
    def __init__(self, env: Env, nats_server: NatsServer, admin: MemoryClient, tokens: dict[str, dict[str, Any]]):
        self.env, self.nats, self.admin, self.tokens = env, nats_server, admin, tokens

    @property
    def prefix(self) -> str:
        return self.env.settings.subject_prefix


def _record_nats(state: Path, server: NatsServer) -> None:
    """What `pamledger up` records, so the service knows this NATS is its own (and whom to make reload)."""
    (state / SERVERS_FILE).write_text(json.dumps({"nats_url": server.url, "nats_port": server.port,
                                                  "nats_pid": server.pid}))


@pytest.fixture(scope="module")
async def world(servers: Servers, tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[World]:
    # What `pamledger up` does, with the session's Postgres: tokens, a configuration, NATS, the ledger's users.
    async with locked_env(servers, tmp_path_factory.mktemp("nats_auth_state"), "natsauth") as env, serving(env):
        state = env.settings.state_dir
        admin = await _client(env, read_token(state / "admin.token"))
        await admin.create_scope(SCOPE)
        await put_actor(admin, ALICE["actor_id"], "agent", [parse_grant("team:a:*=*")])
        await put_actor(admin, BOB["actor_id"], "agent", [parse_grant("team:a:*=read,query")])
        tokens = {"alice": await issue_token(admin, ALICE["actor_id"]),
                  "bob": await issue_token(admin, BOB["actor_id"])}
        try:
            yield World(env, env.nats_server, admin, tokens)
        finally:
            await admin.close()


async def _client(env: Env, token: str | None) -> MemoryClient:
    client = await MemoryClient.connect(env.nats_url, env.settings.subject_prefix, token=token)
    client.retries = 0
    return client


async def _agent(world: World, name: str, timeout: float = 10.0) -> MemoryClient:
    """A client of the named token, once NATS knows its login (the users are rewritten within seconds)."""
    async def connected() -> MemoryClient | None:
        try:
            return await _client(world.env, world.tokens[name]["token"])
        except PamspecError as exc:
            assert exc.code == "access_denied", exc.envelope()
            return None
    client: MemoryClient = await wait_for(connected, timeout=timeout, interval=0.2)
    return client


class Raw:
    """A bare nats-py connection with a token's login, collecting the server's errors (permission refusals)."""

    def __init__(self) -> None:
        self.errors: list[str] = []
        self.received: list[Any] = []
        self.nc: Any = None

    async def open(self, url: str, token: str) -> Raw:
        async def error(exc: Exception) -> None:
            self.errors.append(str(exc).lower())
        login = agent_login(token)
        assert login is not None
        self.nc = await nats.connect(url, error_cb=error, max_reconnect_attempts=1, allow_reconnect=False,
                                     **login.options())
        return self

    async def listen(self, subject: str, queue: str = "") -> None:
        async def got(msg: Any) -> None:
            self.received.append(msg)
        await self.nc.subscribe(subject, queue=queue, cb=got)

    async def refused(self, what: str, subject: str) -> bool:
        await self.nc.flush()
        return any(f"permissions violation for {what} to \"{subject.lower()}\"" in e for e in self.errors)


async def test_config_is_private_and_names_the_service_and_each_live_token(world: World) -> None:
    path = config_path(world.env.settings.state_dir)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert stat.S_IMODE((world.env.settings.state_dir / "nats-service.password").stat().st_mode) == 0o600
    async def listed() -> bool:
        users = {u["user"]: u for u in json.loads(path.read_text())["authorization"]["users"]}
        return {world.tokens["alice"]["token_id"], world.tokens["bob"]["token_id"], SERVICE_USER} <= set(users)
    await wait_for(listed, timeout=10)
    text = path.read_text()
    for issued in world.tokens.values():
        assert issued["token"] not in text  # bcrypt only, never a token
    service = read_service_login(world.env.settings.state_dir)
    assert service is not None and service.password not in text


async def test_nobody_connects_without_a_known_login(world: World) -> None:
    for options in ({}, {"user": world.tokens["alice"]["token_id"], "password": "pam_not_it"},
                    {"user": SERVICE_USER, "password": "guess"}):
        with pytest.raises(nats.errors.Error, match="Authorization Violation"):
            await nats.connect(world.nats.url, max_reconnect_attempts=1, allow_reconnect=False, connect_timeout=2,
                               **options)


async def test_an_agent_cannot_wiretap_impersonate_or_reach_the_stream(world: World) -> None:
    alice, bob = world.tokens["alice"], world.tokens["bob"]
    await _agent(world, "alice")  # its login is known by now
    spy = await Raw().open(world.nats.url, alice["token"])
    prefix = world.prefix
    try:
        forbidden = ["_INBOX.>", f"_INBOX.{bob['token_id']}.>", f"{prefix}.ledger.>", "$JS.API.>", f"{prefix}.cmd.*",
                     f"{prefix}.query.*", f"{prefix}.sub.deliver.>", ">"]
        for subject in forbidden:
            await spy.listen(subject, queue="pamledger-writer" if ".cmd." in subject else "")
        for subject in forbidden:
            assert await wait_for(lambda s=subject: spy.refused("subscription", s), timeout=5), spy.errors
        # Bob works meanwhile: his request, reply and the stream's copy of it reach none of Alice's subscriptions.
        bob_client = await _agent(world, "bob")
        try:
            assert (await bob_client.query(SCOPE, limit=1))["items"] is not None
        finally:
            await bob_client.close()
        assert spy.received == []
        # Nor may she send what only the service sends, or talk to the JetStream API.
        for subject in (f"{prefix}.cmd.open_subscription", f"{prefix}.cmd.record_access_denied",
                        f"{prefix}.cmd.record_index_event", "$JS.API.STREAM.INFO." + world.env.settings.stream_name,
                        f"{prefix}.ledger.p0.x.created"):
            await spy.nc.publish(subject, b"{}")
            assert await wait_for(lambda s=subject: spy.refused("publish", s), timeout=5), spy.errors
    finally:
        await spy.nc.close()


async def test_the_whole_service_works_for_an_agent_through_the_configuration(world: World) -> None:
    alice = await _agent(world, "alice")
    try:
        subscription = await alice.subscribe(SCOPE, ALICE)
        assert subscription.delivery_subject.startswith(f"_INBOX.{world.tokens['alice']['token_id']}.")
        assert subscription.subscription_id in {s["subscription_id"] for s in await alice.subscriptions()}
        made = await alice.create(SCOPE, "claim", {"text": "through the locked transport"}, ALICE, prov(ALICE))
        read = await alice.read(SCOPE, made["object_id"])
        assert read["canonical_content"] == {"text": "through the locked transport"}
        async def found() -> bool:
            page = await alice.query(SCOPE, limit=10, validation_states=["unverified"])
            return any(i["envelope"]["object_id"] == made["object_id"] for i in page["items"])
        await wait_for(found, timeout=15)
        async def first() -> dict[str, Any]:
            async for event in subscription:
                if event.get("event", {}).get("object_id") == made["object_id"]:
                    return event
            raise AssertionError("the subscription ended")
        event = await asyncio.wait_for(first(), timeout=15)
        assert event["event"]["scope_id"] == SCOPE
        await subscription.close()
    finally:
        await alice.close()


async def test_a_push_to_another_tokens_inbox_is_refused(world: World) -> None:
    alice = await _agent(world, "alice")
    try:
        bob_inbox = f"_INBOX.{world.tokens['bob']['token_id']}.stolen"
        with pytest.raises(PamspecError) as err:
            await alice.subscription_request("open", {"scope_id": SCOPE, "actor": ALICE,
                                                      "delivery": {"mode": "push", "subject": bob_inbox}}, ALICE)
        assert (err.value.code, err.value.policy_rule_id) == ("access_denied", "subscription.foreign_inbox")
        with pytest.raises(PamspecError) as err:
            await alice.subscription_request("open", {"scope_id": SCOPE, "actor": ALICE, "delivery": {
                "mode": "push", "subject": "_INBOX.anything"}}, ALICE)
        assert err.value.policy_rule_id == "subscription.foreign_inbox"
    finally:
        await alice.close()


async def test_a_token_issued_at_run_time_logs_in_and_a_revoked_one_is_cut_off(world: World) -> None:
    issued = await issue_token(world.admin, BOB["actor_id"], label="short-lived")
    world.tokens["carol"] = issued
    # issue_token returns once the token works, its NATS login included: no waiting needed here
    client = await _client(world.env, issued["token"])
    watcher = await Raw().open(world.nats.url, issued["token"])
    try:
        await revoke_token(world.admin, issued["token_id"])
        login = agent_login(issued["token"])
        assert login is not None
        async def refused() -> bool:
            try:
                other = await nats.connect(world.nats.url, max_reconnect_attempts=1, allow_reconnect=False,
                                           connect_timeout=2, **login.options())
            except nats.errors.Error:
                return True
            await other.close()
            return False
        await wait_for(refused, timeout=10, interval=0.2)
        # the connection it already had is closed by the reload, too
        await wait_for(lambda: watcher.nc.is_closed or any("authorization" in e for e in watcher.errors), timeout=10)
        with pytest.raises(PamspecError) as err:
            await _client(world.env, issued["token"])
        assert err.value.code == "access_denied", err.value.envelope()
    finally:
        with contextlib.suppress(nats.errors.Error):  # cut off by the reload: it is reconnecting in vain
            await client.close()
        await client.nc.close()
        if not watcher.nc.is_closed:
            await watcher.nc.close()


async def _closed_row(world: World, subscription_id: str) -> tuple[str, str, int] | None:
    """(status, close_reason, last_delivered_sequence) of a closed subscription, as the gateway stored it."""
    async with await psycopg.AsyncConnection.connect(world.env.database_url) as conn:
        cur = await conn.execute("SELECT status, close_reason, last_delivered_sequence FROM subscriptions"
                                 " WHERE subscription_id = %s AND status <> 'open'", (subscription_id,))
        row = await cur.fetchone()
    return None if row is None else (str(row[0]), str(row[1]), int(row[2]))


async def _next_event(subscription: Any, object_id: str) -> dict[str, Any]:
    async def first() -> dict[str, Any]:
        async for event in subscription:
            if event.get("event", {}).get("object_id") == object_id:
                return dict(event)
        raise AssertionError(f"the subscription ended: {subscription.closed}")
    return await asyncio.wait_for(first(), timeout=15)


async def test_a_push_subscription_goes_on_under_the_token_that_resumed_it_and_ends_with_it(world: World) -> None:
    """Resumed with a second token of the same actor, pushes go to the second token's inbox (the first one's
    is out of its reach), revoking the first token no longer ends it, and revoking the second closes it
    (access_revoked, at the last delivered sequence) with no event needed to notice."""
    second = await issue_token(world.admin, ALICE["actor_id"], label="resumer")
    first_client, second_client = await _agent(world, "alice"), await _client(world.env, second["token"])
    first_token = await issue_token(world.admin, ALICE["actor_id"], label="opener")
    opener = await _client(world.env, first_token["token"])
    try:
        opened = await opener.subscribe(SCOPE, ALICE)
        assert opened.delivery_subject.startswith(f"_INBOX.{first_token['token_id']}.")
        # Another token must say where its pushes go, and only its own inbox will do.
        with pytest.raises(PamspecError) as err:
            await second_client.subscription_request("resume", {"subscription_id": opened.subscription_id}, ALICE)
        assert err.value.code == "invalid_request", err.value.envelope()
        with pytest.raises(PamspecError) as err:
            await second_client.subscription_request("resume", {
                "subscription_id": opened.subscription_id,
                "delivery_subject": f"_INBOX.{first_token['token_id']}.x"}, ALICE)
        assert err.value.policy_rule_id == "subscription.foreign_inbox"
        resumed = await second_client.subscribe(SCOPE, ALICE, subscription_id=opened.subscription_id)
        assert resumed.delivery_subject.startswith(f"_INBOX.{second['token_id']}.")
        made = await first_client.create(SCOPE, "claim", {"text": "to the resumer"}, ALICE, prov(ALICE))
        await _next_event(resumed, made["object_id"])
        # The opener's token revoked: the subscription goes on under the resumer's.
        await revoke_token(world.admin, first_token["token_id"])

        async def gateway_refuses_the_opener() -> bool:  # the gateway's own grants have seen the revocation
            try:
                await opener.subscription_request("list", {})
            except Exception:  # noqa: BLE001 - access_denied, or the login cut by the NATS reload
                return True
            return False
        await wait_for(gateway_refuses_the_opener, timeout=15, interval=0.2)
        # Proving that nothing closes it takes a window: three sweeps of the gateway's revocation check.
        await asyncio.sleep(3 * REVOCATION_SWEEP_SECONDS)
        assert await _closed_row(world, opened.subscription_id) is None
        later = await first_client.create(SCOPE, "claim", {"text": "after the opener's revocation"}, ALICE,
                                          prov(ALICE))
        delivered = await _next_event(resumed, later["object_id"])
        # The resumer's token revoked: closed by itself, naming the last event it delivered.
        await revoke_token(world.admin, second["token_id"])
        row = await wait_for(lambda: _closed_row(world, opened.subscription_id), timeout=15)
        assert row[1] == "access_revoked" and row[2] == delivered["ledger_sequence"], row
    finally:
        for client in (first_client, second_client, opener):
            with contextlib.suppress(Exception):
                await client.close()


async def test_the_service_logs_in_again_after_nats_is_killed_and_restarted(world: World) -> None:
    world.nats.kill()
    world.nats.restart()  # the same configuration file (-c), port and store
    _record_nats(world.env.settings.state_dir, world.nats)
    alice = await _agent(world, "alice", timeout=30)
    try:
        await wait_for(lambda: answers(alice), timeout=30)
        made = await alice.create(SCOPE, "claim", {"text": "after the restart"}, ALICE, prov(ALICE))
        assert (await alice.read(SCOPE, made["object_id"]))["version_id"] == made["version_id"]
    finally:
        await alice.close()
