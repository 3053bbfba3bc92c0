"""A property of query.related with auth enforced (real tokens, through NATS): whatever grants an actor holds and
whatever walk it asks for, the answer never carries an object or a relationship of a scope the actor may not
read, and it is exactly the walk the documented rules give (docs/protocol.md "query.related").

How: one service for the module, three scopes whose objects and relationships carry a marker word unique to
their scope, a random graph of relationships inside scopes and across them (both ways, every directionality),
one object deleted. Each example registers a fresh actor with generated grants, issues it a token and asks
generated walks. The oracle is written here from the documented rules, not taken from query/related.py.
"""

from __future__ import annotations

import itertools
import json
import random
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

pytestmark = pytest.mark.profile("PAMSPEC-Relationship")  # docs/implementation-report.md

SCOPES = ("graph:a:one", "graph:a:two", "graph:b:one")
PATTERNS = (*SCOPES, "graph:a:*", "graph:*", "*")
OPERATIONS = ("read", "query", "create")
TYPES = ("supports", "references", "contradicts")
ADMIN = {"actor_id": "actor:pamledger:admin", "actor_kind": "operator"}
PER_SCOPE = 5
_serial = itertools.count()
Node = tuple[str, str]


@dataclass(frozen=True)
class Edge:
    scope_id: str  # where the relationship is stored (its source's scope)
    relationship_id: str
    relationship_type: str
    source: Node
    target: Node
    directionality: str


@dataclass
class Graph:
    env: Env
    admin: MemoryClient
    markers: dict[str, str]
    objects: dict[str, list[str]] = field(default_factory=dict)
    edges: list[Edge] = field(default_factory=list)
    deleted: set[Node] = field(default_factory=set)


def _marker() -> str:
    return "mk" + "".join(chr(ord("a") + b % 26) for b in uuid.uuid4().bytes[:10])


def _prov() -> dict[str, Any]:
    return {"provenance_id": f"prov:{uuid.uuid4()}", "actor": ADMIN, "activity": "graph-property"}


@pytest.fixture(scope="module")
def env(servers: Servers, tmp_path_factory: pytest.TempPathFactory) -> Env:
    return enforced_env(servers, tmp_path_factory.mktemp("relauth_state"), "relauth")


@pytest.fixture(scope="module")
async def graph(env: Env) -> AsyncIterator[Graph]:
    async with serving(env):
        admin = await admin_client(env)
        g = Graph(env, admin, {s: _marker() for s in SCOPES})
        try:
            await _build(g, random.Random(20261201))
            yield g
        finally:
            await admin.close()


async def _build(g: Graph, rng: random.Random) -> None:
    for scope in SCOPES:
        await g.admin.create_scope(scope)
        g.objects[scope] = [(await g.admin.create(scope, "claim", {"text": f"{g.markers[scope]} note {i}"}, ADMIN,
                                                  _prov()))["object_id"] for i in range(PER_SCOPE)]
    nodes = [(s, o) for s in SCOPES for o in g.objects[s]]
    pairs: set[tuple[Node, Node]] = set()
    while len(g.edges) < 24:
        source, target = rng.choice(nodes), rng.choice(nodes)
        if source == target or (source, target) in pairs:
            continue
        pairs.add((source, target))
        kind, directionality = rng.choice(TYPES), rng.choice(("directed", "directed", "bidirectional", "undirected"))
        body: dict[str, Any] = {"scope_id": source[0], "source_object_id": source[1], "target_object_id": target[1],
                                "relationship_type": kind, "directionality": directionality, "actor": ADMIN,
                                "provenance": _prov(), "canonical_content": {"why": g.markers[source[0]]}}
        if target[0] != source[0]:
            body.update(target_scope_id=target[0], policy_basis="policy:graph-property")
        made = await g.admin.command("relate", body)
        g.edges.append(Edge(source[0], made["relationship_id"], kind, source, target, directionality))
    gone = (SCOPES[0], g.objects[SCOPES[0]][-1])
    head = await g.admin.read(*gone)
    await g.admin.delete(gone[0], gone[1], head["version_id"], ADMIN, _prov())
    g.deleted.add(gone)
    probe = await g.admin.related(SCOPES[0], g.objects[SCOPES[0]][0])  # waits for the projection (min_sequence)
    assert probe["min_sequence_reached"] is True


def allowed(grants: list[tuple[list[str], list[str]]], scope_id: str, operation: str = "read") -> bool:
    def covers(pattern: str) -> bool:
        return pattern == scope_id or pattern == "*" or (pattern.endswith("*") and scope_id.startswith(pattern[:-1]))
    return any(any(covers(p) for p in scopes) and ("*" in ops or operation in ops) for scopes, ops in grants)


def expected_walk(g: Graph, grants: list[tuple[list[str], list[str]]], origin: Node, direction: str, hops: int,
                  types: list[str] | None) -> tuple[dict[Node, tuple[int, str]], dict[str, int]]:
    """The documented walk: {node: (hop, endpoint_state)} and {relationship_id: hop}."""
    nodes: dict[Node, tuple[int, str]] = {origin: (0, "deleted" if origin in g.deleted else "available")}
    shown: dict[str, int] = {}
    frontier = [origin]
    for hop in range(1, hops + 1):
        reached: list[Node] = []
        for node in frontier:
            for e in g.edges:
                if e.relationship_id in shown or (types is not None and e.relationship_type not in types):
                    continue
                if not allowed(grants, e.scope_id):  # a relationship of a scope the actor cannot read: unseen
                    continue
                at_source, at_target = e.source == node, e.target == node
                if not (at_source or at_target):
                    continue
                both_ways = e.directionality != "directed"
                if direction == "outgoing" and not (at_source or both_ways):
                    continue
                if direction == "incoming" and not (at_target or both_ways):
                    continue
                shown[e.relationship_id] = hop
                neighbour = e.target if at_source else e.source
                if neighbour not in nodes:
                    state = ("not_readable" if not allowed(grants, neighbour[0])
                             else "deleted" if neighbour in g.deleted else "available")
                    nodes[neighbour] = (hop, state)
                    reached.append(neighbour)
        frontier = [n for n in reached if nodes[n][1] == "available"]
    return nodes, shown


grant = st.tuples(st.lists(st.sampled_from(PATTERNS), min_size=1, max_size=2, unique=True),
                  st.lists(st.sampled_from((*OPERATIONS, "*")), min_size=1, max_size=2, unique=True))
walk = st.tuples(st.sampled_from(SCOPES), st.integers(0, PER_SCOPE - 1), st.sampled_from(("outgoing", "incoming", "both")),
                 st.integers(1, 3), st.none() | st.lists(st.sampled_from(TYPES), min_size=1, max_size=2, unique=True))


def _text(value: Any) -> str:
    return json.dumps(value, sort_keys=True, default=str)


# Each example costs about a second (a token to issue and wait for): no shrinking, the failing example is
# printed as generated.
@settings(max_examples=25, deadline=None, suppress_health_check=list(HealthCheck),
          phases=(Phase.explicit, Phase.reuse, Phase.generate))
@given(grants=st.lists(grant, min_size=1, max_size=3), walks=st.lists(walk, min_size=1, max_size=5))
async def test_a_walk_never_returns_what_the_actor_may_not_read(
        graph: Graph, grants: list[tuple[list[str], list[str]]],
        walks: list[tuple[str, int, str, int, list[str] | None]]) -> None:
    actor = {"actor_id": f"actor:relprop:{next(_serial)}:{uuid.uuid4().hex[:6]}", "actor_kind": "agent"}
    await put_actor(graph.admin, actor["actor_id"], "agent",
                    [parse_grant(f"{','.join(s)}={','.join(o)}") for s, o in grants])
    issued = await issue_token(graph.admin, actor["actor_id"])
    client = await token_client(graph.env, issued["token"])
    try:
        await wait_for(lambda: _authenticated(client, actor), timeout=10)
        for scope_id, pick, direction, hops, types in walks:
            origin = (scope_id, graph.objects[scope_id][pick])
            where = f"related({origin}, {direction}, hops={hops}, types={types}) with grants {grants}"
            try:
                reply = await client.related(scope_id, origin[1], types, direction, hops, 500, actor)
            except PamspecError as exc:
                event(f"refused: {exc.code}")
                assert exc.code == "access_denied" and not allowed(grants, scope_id), (where, exc.envelope())
                assert not any(m in _text(exc.envelope()) for m in graph.markers.values()), where
                continue
            assert allowed(grants, scope_id), f"{where}: served although not granted"
            _check(graph, grants, where, reply, expected_walk(graph, grants, origin, direction, hops, types))
    finally:
        await client.close()


def _check(graph: Graph, grants: list[tuple[list[str], list[str]]], where: str, reply: dict[str, Any],
           expected: tuple[dict[Node, tuple[int, str]], dict[str, int]]) -> None:
    unreadable = [s for s in SCOPES if not allowed(grants, s)]
    text = _text(reply)
    leaked = [s for s in unreadable if graph.markers[s] in text]
    assert not leaked, f"{where}: carries content of unreadable scopes {leaked}: {text[:600]}"
    for node in reply["nodes"]:
        if "envelope" in node:
            assert node["envelope"]["scope_id"] not in unreadable, (where, node)
        elif node["endpoint_state"] == "not_readable":
            assert node["scope_id"] in unreadable, (where, node)
    for e in reply["edges"]:
        assert e["relationship"]["scope_id"] not in unreadable, (where, e)
    nodes, shown = expected
    got_nodes = {(n["scope_id"], n["object_id"]): (n["hop"], n["endpoint_state"]) for n in reply["nodes"]}
    assert got_nodes == nodes, f"{where}: nodes {got_nodes} != expected {nodes}"
    got_edges = {e["relationship"]["relationship_id"]: e["hop"] for e in reply["edges"]}
    assert got_edges == shown, f"{where}: edges {got_edges} != expected {shown}"
    assert not reply["truncated"]
    crossed = {s for s, _ in got_nodes if s != reply["from"]["scope_id"]}
    event("crossed into a readable scope" if any(nodes[n][1] == "available" and n[0] in crossed for n in nodes)
          else "stayed in scope or stopped at the border")


async def _authenticated(client: MemoryClient, actor: dict[str, str]) -> bool:
    """True once the service knows the token (a grant rule refusing, or not found, means authenticated)."""
    try:
        await client.read(SCOPES[0], "mem:probe", actor=actor)
    except PamspecError as exc:
        return exc.code == "object_not_found" or (exc.policy_rule_id or "").startswith("authz.")
    return True


async def test_under_a_delegation_the_walk_stays_in_the_delegated_scope(graph: Graph) -> None:
    """A delegation covers one scope: the walk shows nothing elsewhere, even where the delegate could read on its
    own; a delegation restricted to some objects refuses a walk (it returns objects the request does not name)."""
    from datetime import datetime, timedelta, timezone

    from pamledger_client.delegation import grant_delegation

    def at(minutes: float) -> str:
        return (datetime.now(timezone.utc) + timedelta(minutes=minutes)).strftime("%Y-%m-%dT%H:%M:%S.%fZ")

    crossing = next(e for e in graph.edges if e.source[0] == SCOPES[0] and e.target[0] != SCOPES[0]
                    and e.source not in graph.deleted)
    tag = uuid.uuid4().hex[:6]
    boss = {"actor_id": f"actor:relboss:{tag}", "actor_kind": "agent"}
    worker = {"actor_id": f"actor:relworker:{tag}", "actor_kind": "agent"}
    await put_actor(graph.admin, boss["actor_id"], "agent", [parse_grant("graph:*=read,query")])
    await put_actor(graph.admin, worker["actor_id"], "agent", [parse_grant(f"{crossing.target[0]}=read")])
    clients = [await token_client(graph.env, (await issue_token(graph.admin, a["actor_id"]))["token"])
               for a in (boss, worker)]
    boss_client, worker_client = clients
    try:
        await wait_for(lambda: _authenticated(boss_client, boss), timeout=10)
        await wait_for(lambda: _authenticated(worker_client, worker), timeout=10)
        whole = await grant_delegation(boss_client, SCOPES[0], boss, worker, ["read"], "policy:handoff", at(-1), at(60))
        some = await grant_delegation(boss_client, SCOPES[0], boss, worker, ["read"], "policy:handoff", at(-1), at(60),
                                      granted_object_ids=[crossing.source[1]])
        own = await boss_client.related(SCOPES[0], crossing.source[1], actor=boss)
        assert _state(own, crossing.target) == "available"  # the grantor itself reads the other scope
        acting = {**worker, "on_behalf_of_actor_id": boss["actor_id"], "delegation_id": whole["delegation_id"]}
        delegated = await worker_client.related(SCOPES[0], crossing.source[1], actor=acting)
        assert _state(delegated, crossing.target) == "not_readable"
        assert {n["scope_id"] for n in delegated["nodes"] if "envelope" in n} == {SCOPES[0]}
        assert graph.markers[crossing.target[0]] not in _text(delegated)
        narrow = {**acting, "delegation_id": some["delegation_id"]}
        with pytest.raises(PamspecError) as err:
            await worker_client.related(SCOPES[0], crossing.source[1], actor=narrow)
        assert err.value.code == "access_denied", err.value.envelope()
        with pytest.raises(PamspecError) as err:
            await worker_client.related(SCOPES[0], crossing.source[1], actor=worker)
        assert err.value.code == "access_denied" and err.value.policy_rule_id == "authz.scope_not_granted"
    finally:
        for c in clients:
            await c.close()


def _state(reply: dict[str, Any], node: Node) -> str:
    return str(next(n["endpoint_state"] for n in reply["nodes"] if (n["scope_id"], n["object_id"]) == node))
