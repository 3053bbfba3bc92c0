"""A property of authorization, through NATS with real tokens and auth enforced: whatever actors, grants and
requests are generated, no reply, pushed event or search result carries data of a scope the actor may not
read, and every refusal is `access_denied` with a rule id.

Why: isolation between scopes is the product's promise to each tenant. Hand-written cases cover the rules
one by one (test_auth.py); this test lets hypothesis combine grant patterns (exact ids, prefixes ending in
`*`, `*`), operations and requests in ways nobody thought to write down.

How: one service for the module (auth enforced), a few scopes each holding objects whose content carries a
marker word unique to the scope. Each example registers a fresh actor with generated grants, issues it a
token, and makes generated requests (read, history, query, lexical search, subscribe + receive pushes, and
reads of another scope's object ids through a readable scope). The oracle is written here from the
documented rules (docs/protocol.md "Authorization"), not taken from authz.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import pytest
from hypothesis import HealthCheck, Phase, event, given, settings, strategies as st

from pamledger_client.admin import issue_token, parse_grant, put_actor
from pamledger_client.client import MemoryClient
from pamledger_client.errors import PamspecError
from tests.conftest import Env, Servers, admin_client, enforced_env, serving, token_client, wait_for

SCOPES = ("prop:a:one", "prop:a:two", "prop:b:one", "zeta:c:one")
PATTERNS = (*SCOPES, "prop:a:*", "prop:b:*", "prop:*", "zeta:*", "prop:a:t*", "*")
OPERATIONS = ("read", "inspect_history", "query", "subscribe", "unsubscribe", "create")
# What each generated request needs (docs/protocol.md "Authorization").
NEEDS = {"read": "read", "history": "inspect_history", "query": "query", "search": "query", "subscribe": "subscribe",
         "read_foreign": "read"}
DENIAL_RULES = {"authz.scope_not_granted", "authz.operation_not_granted"}
ADMIN = {"actor_id": "actor:pamledger:admin", "actor_kind": "operator"}
COMMON = "harbor"  # a word every scope's objects share, so a lexical search finds something anywhere
ALL_VALIDATION = ["unverified", "corroborated", "disputed", "rejected"]
_serial = itertools.count()


def _marker() -> str:
    return "mk" + "".join(chr(ord("a") + b % 26) for b in uuid.uuid4().bytes[:10])


@dataclass
class World:
    env: Env
    admin: MemoryClient
    markers: dict[str, str]  # scope -> its marker word
    objects: dict[str, list[str]] = field(default_factory=dict)  # scope -> object ids
    clients: list[MemoryClient] = field(default_factory=list)

    def foreign_markers(self, scope_id: str) -> list[str]:
        return [m for s, m in self.markers.items() if s != scope_id]


@pytest.fixture(scope="module")
def env(servers: Servers, tmp_path_factory: pytest.TempPathFactory) -> Env:
    return enforced_env(servers, tmp_path_factory.mktemp("authprop_state"), "authprop")


_client = token_client


def _prov(actor: dict[str, str]) -> dict[str, Any]:
    return {"provenance_id": f"prov:{uuid.uuid4()}", "actor": actor, "activity": "property-test"}


async def _write(world: World, scope_id: str, text: str) -> dict[str, Any]:
    made = await world.admin.create(scope_id, "claim", {"text": text}, ADMIN, _prov(ADMIN),
                                    validation_state="corroborated")
    world.objects.setdefault(scope_id, []).append(made["object_id"])
    return made


@pytest.fixture(scope="module")
async def world(env: Env) -> AsyncIterator[World]:
    async with serving(env):
        admin = await admin_client(env)
        w = World(env, admin, {s: _marker() for s in SCOPES})
        try:
            for scope in SCOPES:
                await admin.create_scope(scope)
            for scope in SCOPES:
                marker = w.markers[scope]
                await _write(w, scope, f"the {COMMON} note of {marker} mentions tides")
                await _write(w, scope, f"{marker} second {COMMON} entry about ropes")
            for scope in SCOPES:  # the projection has them all (the admin client waits for its own writes)
                page = await admin.query(scope)
                assert len(page["items"]) == 2, page
            yield w
        finally:
            for c in (admin, *w.clients):
                await c.close()


def allowed(grants: list[tuple[list[str], list[str]]], scope_id: str, operation: str) -> bool:
    """The oracle: some grant names the scope (exactly, by a `prefix*` pattern, or `*`) and the operation."""
    def covers(pattern: str) -> bool:
        return pattern == scope_id or pattern == "*" or (pattern.endswith("*") and scope_id.startswith(pattern[:-1]))
    return any(any(covers(p) for p in scopes) and ("*" in ops or operation in ops) for scopes, ops in grants)


grant = st.tuples(st.lists(st.sampled_from(PATTERNS), min_size=1, max_size=2, unique=True),
                  st.lists(st.sampled_from((*OPERATIONS, "*")), min_size=1, max_size=3, unique=True))
request = st.tuples(st.sampled_from(tuple(NEEDS)), st.sampled_from(SCOPES), st.integers(0, 7))


def _text(value: Any) -> str:
    return json.dumps(value, sort_keys=True, default=str)


def _assert_clean(world: World, scope_id: str, where: str, value: Any) -> None:
    text = _text(value)
    leaked = [m for m in world.foreign_markers(scope_id) if m in text]
    assert not leaked, f"{where} on {scope_id} carries markers of other scopes {leaked}: {text[:600]}"


async def _make(world: World, kind: str, client: MemoryClient, actor: dict[str, str], scope_id: str, pick: int
                ) -> dict[str, Any]:
    own = world.objects[scope_id]
    if kind == "read":
        return await client.read(scope_id, own[pick % len(own)] if pick < 6 else f"mem:absent-{pick}", actor=actor)
    if kind == "history":
        return await client.history(scope_id, own[pick % len(own)] if pick < 6 else f"mem:absent-{pick}", actor)
    if kind == "query":
        return await client.query(scope_id, actor, validation_states=ALL_VALIDATION)
    if kind == "search":  # the common word, or another scope's marker: neither may bring that scope's data
        words = [COMMON, *world.markers.values()]
        return await client.search(scope_id, text=words[pick % len(words)], mode="lexical", actor=actor,
                                   filter={"validation_states": ALL_VALIDATION})
    if kind == "read_foreign":  # an id that exists, but in another scope: never served through this one
        others = [o for s, ids in world.objects.items() if s != scope_id for o in ids]
        return await client.read(scope_id, others[pick % len(others)], actor=actor)
    raise AssertionError(kind)


async def _subscribe(world: World, client: MemoryClient, actor: dict[str, str], scope_id: str) -> list[dict[str, Any]]:
    """Open from the start of the ledger, then write live to another scope and to this one; every event
    pushed until the live one arrives."""
    subscription = await client.subscribe(scope_id, actor, after_sequence=0)
    events: list[dict[str, Any]] = []
    try:
        other = next(s for s in SCOPES if s != scope_id)
        await _write(world, other, f"live {world.markers[other]} {COMMON}")
        live = await _write(world, scope_id, f"live {world.markers[scope_id]} {COMMON}")

        async def until_live() -> None:
            async for event in subscription:
                events.append(event)
                if event["ledger_sequence"] >= live["ledger_sequence"]:
                    return
        await asyncio.wait_for(until_live(), 30)
    finally:
        await subscription.close()
    assert any(e["ledger_sequence"] == live["ledger_sequence"] for e in events)
    return events


# Each example costs about a second (a token to issue and wait for, requests, subscriptions): no shrinking,
# which would rerun dozens of them; the failing example is printed as generated.
@settings(max_examples=30, deadline=None, suppress_health_check=list(HealthCheck),
          phases=(Phase.explicit, Phase.reuse, Phase.generate))
@given(grants=st.lists(grant, min_size=1, max_size=3), requests=st.lists(request, min_size=1, max_size=6))
async def test_no_reply_push_or_search_result_carries_a_scope_the_actor_may_not_read(
        world: World, grants: list[tuple[list[str], list[str]]], requests: list[tuple[str, str, int]]) -> None:
    actor = {"actor_id": f"actor:prop:{next(_serial)}:{uuid.uuid4().hex[:6]}", "actor_kind": "agent"}
    await put_actor(world.admin, actor["actor_id"], "agent",
                    [parse_grant(f"{','.join(s)}={','.join(o)}") for s, o in grants])
    issued = await issue_token(world.admin, actor["actor_id"])
    client = await _client(world.env, issued["token"])
    world.clients.append(client)
    # the service takes the new credential at its next grants refresh (0.5 s)
    await wait_for(lambda: _authenticated(client, actor), timeout=10)
    for kind, scope_id, pick in requests:
        may = allowed(grants, scope_id, NEEDS[kind])
        where = f"{kind}({scope_id}, pick {pick}) with grants {grants}"
        try:
            if kind == "subscribe":
                reply: Any = await _subscribe(world, client, actor, scope_id)
                for pushed in reply:
                    assert pushed["event"]["scope_id"] == scope_id, (where, pushed)
            else:
                reply = await _make(world, kind, client, actor, scope_id, pick)
        except PamspecError as exc:
            envelope = exc.envelope()
            _assert_clean(world, scope_id, where, envelope)
            event(f"{kind}: {exc.code}")
            if exc.code == "access_denied":
                assert not may, f"{where}: refused although granted: {envelope}"
                assert exc.policy_rule_id in DENIAL_RULES, (where, envelope)
                assert world.markers[scope_id] not in _text(envelope), (where, envelope)
                continue
            # allowed, and the object is not there (an absent id, or another scope's id): said the same way
            assert may, f"{where}: a refusal must be access_denied, got {envelope}"
            assert exc.code == "object_not_found" and (kind == "read_foreign" or pick >= 6), (where, envelope)
            continue
        event(f"{kind}: served")
        assert may, f"{where}: served although not granted: {_text(reply)[:400]}"
        assert kind != "read_foreign", f"{where}: another scope's object served: {_text(reply)[:400]}"
        _assert_clean(world, scope_id, where, reply)
        if kind in ("read", "query") and pick < 6:  # not vacuous: what was granted is served
            assert world.markers[scope_id] in _text(reply), (where, _text(reply)[:400])
    await client.close()
    world.clients.remove(client)


async def _authenticated(client: MemoryClient, actor: dict[str, str]) -> bool:
    """True once the service knows the token: an answer only an authenticated caller gets (served, not found,
    or refused by a grant rule, which is decided after authentication)."""
    try:
        await client.read(SCOPES[0], "mem:probe", actor=actor)
    except PamspecError as exc:
        return exc.code == "object_not_found" or (exc.policy_rule_id or "").startswith("authz.")
    return True
