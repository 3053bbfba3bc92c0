"""Evaluation snapshots with auth enforced (real tokens, through NATS): sealing a snapshot needs `read` on its
scope, and its descriptors and answers are read under the same grant."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest

from pamledger_client.admin import issue_token, parse_grant, put_actor
from pamledger_client.client import MemoryClient
from pamledger_client.errors import PamspecError
from tests.conftest import Env, Servers, admin_client, can_query, enforced_env, serving, token_client, wait_for

pytestmark = pytest.mark.profile("PAMSPEC-Evaluation")  # partially built, not claimed (docs/implementation-report.md)

READABLE, HIDDEN, WRITE_ONLY = "eval:readable", "eval:hidden", "eval:write-only"
HISTORY = "eval:history"  # read and inspect_history: what a snapshot diff needs
AGENT = {"actor_id": "actor:agent:evaluator", "actor_kind": "agent"}
ADMIN = {"actor_id": "actor:pamledger:admin", "actor_kind": "operator"}
PROVENANCE = {"provenance_id": "prov:snapauth", "actor": ADMIN, "activity": "setup"}


@pytest.fixture(scope="module")
def env(servers: Servers, tmp_path_factory: pytest.TempPathFactory) -> Env:
    return enforced_env(servers, tmp_path_factory.mktemp("snapauth_state"), "snapauth")


@pytest.fixture(scope="module")
async def world(env: Env) -> AsyncIterator[tuple[MemoryClient, MemoryClient, dict[str, Any]]]:
    async with serving(env):
        admin = await admin_client(env)
        made = {}
        for scope in (READABLE, HIDDEN, WRITE_ONLY, HISTORY):
            await admin.create_scope(scope)
            made[scope] = await admin.create(scope, "claim", {"statement": f"a claim of {scope}"}, ADMIN, PROVENANCE)
        await put_actor(admin, AGENT["actor_id"], "agent",
                        [parse_grant(f"{READABLE}=read,query"), parse_grant(f"{WRITE_ONLY}=create"),
                         parse_grant(f"{HISTORY}=read,inspect_history")])
        agent = await token_client(env, (await issue_token(admin, AGENT["actor_id"]))["token"])
        await wait_for(lambda: can_query(agent, READABLE), timeout=10)
        try:
            yield admin, agent, made
        finally:
            await agent.close()
            await admin.close()


async def test_a_reader_seals_a_snapshot_of_its_scope_and_reads_at_it(
        world: tuple[MemoryClient, MemoryClient, dict[str, Any]]) -> None:
    _, agent, made = world
    sealed = await agent.snapshot_create(READABLE, AGENT)
    sid = sealed["snapshot"]["snapshot_id"]
    assert sealed["snapshot"]["created_by_actor_id"] == AGENT["actor_id"]
    found = await agent.read(READABLE, made[READABLE]["object_id"], snapshot_id=sid)
    assert found["envelope"]["canonical_content"] == {"statement": f"a claim of {READABLE}"}
    assert (await agent.snapshot_show(READABLE, sid))["snapshot"] == sealed["snapshot"]


@pytest.mark.parametrize("scope", [HIDDEN, WRITE_ONLY])
async def test_sealing_or_listing_a_scope_the_caller_cannot_read_is_access_denied(
        world: tuple[MemoryClient, MemoryClient, dict[str, Any]], scope: str) -> None:
    _, agent, _ = world
    for call in (agent.snapshot_create(scope, AGENT), agent.snapshot_list(scope)):
        with pytest.raises(PamspecError) as caught:
            await call
        assert caught.value.code == "access_denied"


async def test_another_scopes_snapshot_is_not_readable_through_it(
        world: tuple[MemoryClient, MemoryClient, dict[str, Any]]) -> None:
    admin, agent, made = world
    hidden = await admin.snapshot_create(HIDDEN, ADMIN)
    sid = hidden["snapshot"]["snapshot_id"]
    with pytest.raises(PamspecError) as caught:  # named through the readable scope: that scope has no such id
        await agent.read(READABLE, made[HIDDEN]["object_id"], snapshot_id=sid)
    assert caught.value.code == "snapshot_not_found"
    with pytest.raises(PamspecError) as caught:
        await agent.query(HIDDEN, snapshot_id=sid)
    assert caught.value.code == "access_denied"


async def test_a_snapshot_diff_needs_read_and_inspect_history_on_the_scope(
        world: tuple[MemoryClient, MemoryClient, dict[str, Any]]) -> None:
    admin, agent, _ = world
    for scope in (HISTORY, READABLE, HIDDEN):
        first = (await admin.snapshot_create(scope, ADMIN))["snapshot"]["snapshot_id"]
        claim = await admin.create(scope, "claim", {"statement": f"a later claim of {scope}"}, ADMIN, PROVENANCE)
        second = (await admin.snapshot_create(scope, ADMIN))["snapshot"]["snapshot_id"]
        if scope == HISTORY:
            diff = await agent.snapshot_diff(scope, first, second)
            assert diff["added"] == [{"object_id": claim["object_id"], "version_id": claim["version_id"]}]
            continue
        with pytest.raises(PamspecError) as caught:  # READABLE: read without inspect_history; HIDDEN: no grant
            await agent.snapshot_diff(scope, first, second)
        assert caught.value.code == "access_denied", scope
