"""Evaluation runs with auth enforced (real tokens, through NATS): `start_run` hands out a credential that
writes in the evaluation scope only (a write elsewhere is access_denied and recorded like every denial),
reads the snapshot's scope, and stops working once `end_run` closed the run."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import psycopg
import pytest

from pamledger_client.client import MemoryClient
from pamledger_client.errors import PamspecError
from pamledger_client.evaluation import end_run, start_run
from schemas.canonical import decode_json
from tests.conftest import Env, Servers, admin_client, can_query, enforced_env, serving, token_client, wait_for

pytestmark = pytest.mark.profile("PAMSPEC-Evaluation")  # partially built, not claimed (docs/implementation-report.md)

BASE, OTHER = "workspace:evalauth", "workspace:evalauth-other"
RUN = "run:evalauth"
EVAL = f"eval:{RUN}"
ADMIN = {"actor_id": "actor:pamledger:admin", "actor_kind": "operator"}
AGENT = {"actor_id": f"actor:evaluation:{RUN}", "actor_kind": "agent"}


def prov(actor: dict[str, str]) -> dict[str, Any]:
    return {"provenance_id": "prov:evalauth", "actor": actor, "activity": "evaluation"}


@pytest.fixture(scope="module")
def env(servers: Servers, tmp_path_factory: pytest.TempPathFactory) -> Env:
    return enforced_env(servers, tmp_path_factory.mktemp("evalauth_state"), "evalauth")


@pytest.fixture(scope="module")
async def world(env: Env) -> AsyncIterator[tuple[MemoryClient, MemoryClient, dict[str, Any]]]:
    async with serving(env):
        admin = await admin_client(env)
        for scope in (BASE, OTHER):
            await admin.create_scope(scope)
        base = await admin.create(BASE, "claim", {"statement": "in the base"}, ADMIN, prov(ADMIN))
        await admin.snapshot_create(BASE, ADMIN, snapshot_id="snap:evalauth", evaluation_run_id=RUN)
        started = await start_run(admin, BASE, "snap:evalauth", ADMIN)
        agent = await token_client(env, started["credential"]["token"])
        await wait_for(lambda: can_query(agent, EVAL), timeout=10)
        try:
            yield admin, agent, {"started": started, "base": base}
        finally:
            await agent.close()
            await admin.close()


async def denials(env: Env) -> list[dict[str, Any]]:
    async with await psycopg.AsyncConnection.connect(env.database_url) as conn:
        cur = await conn.execute("SELECT event FROM ledger WHERE event_type = 'access_denied' ORDER BY ledger_sequence")
        return [decode_json(bytes(r[0])) for r in await cur.fetchall()]


async def test_the_run_credential_writes_in_its_scope_and_reads_the_base(
        world: tuple[MemoryClient, MemoryClient, dict[str, Any]]) -> None:
    _, agent, made = world
    assert made["started"]["credential"]["actor_id"] == AGENT["actor_id"]
    written = await agent.create(EVAL, "claim", {"statement": "the agent's"}, AGENT, prov(AGENT))
    assert f"evaluation_run:{RUN}" in written["envelope"]["provenance"]["evidence_refs"]
    assert (await agent.read(BASE, made["base"]["object_id"]))["canonical_content"] == {"statement": "in the base"}


@pytest.mark.parametrize("scope", [BASE, OTHER])
async def test_a_write_outside_the_evaluation_scope_is_access_denied_and_recorded(
        env: Env, world: tuple[MemoryClient, MemoryClient, dict[str, Any]], scope: str) -> None:
    _, agent, _ = world
    with pytest.raises(PamspecError) as caught:
        await agent.create(scope, "claim", {"statement": "escape"}, AGENT, prov(AGENT))
    assert caught.value.code == "access_denied"
    recorded = [e["payload"] for e in await denials(env) if e["actor"]["actor_id"] == AGENT["actor_id"]]
    assert any(p["requested_scope_id"] == scope and p["request"] == "cmd.create" for p in recorded), recorded


async def test_after_end_the_credential_stops_working_and_the_scope_stays_readable(
        env: Env, world: tuple[MemoryClient, MemoryClient, dict[str, Any]]) -> None:
    admin, agent, _ = world
    ended = await end_run(admin, EVAL, ADMIN)
    assert ended["credential_revoked"] is True and ended["evaluation_run"]["ended"] is True
    await wait_for(lambda: _refused(agent), timeout=10)
    assert (await admin.query(EVAL, validation_states=["unverified"]))["items"]
    with pytest.raises(PamspecError) as caught:
        await admin.create(EVAL, "claim", {"statement": "late"}, ADMIN, prov(ADMIN))
    assert (caught.value.code, caught.value.details["rule"]) == ("invalid_state_transition", "evaluation_run_ended")


async def _refused(agent: MemoryClient) -> bool:
    try:
        await agent.read(BASE, "mem:anything")
    except PamspecError as exc:
        return exc.code == "access_denied"
    return False
