"""The retention evaluator against the real writer, projector, NATS and Postgres: as a function, as the CLI
(`pamledger retention evaluate`), as the optional `retention` role, and with auth enforced (the service's
credential, in the retention actor's name).

Why: PAMSPEC 9.6 says expiration never changes lifecycle by itself; issue 15 says a scheduled evaluator may
propose expirations only as explicit Transition commands with their own actor and policy basis. These tests
check what lands in the ledger: retention_state `expired` with lifecycle unchanged, the evaluator's actor and
basis on the event, legal holds never touched, a dry run writing nothing, a moved object skipped then taken
next round.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
from collections.abc import AsyncIterator
from datetime import datetime, timedelta, timezone
from typing import Any

import psycopg
import pytest

from authz.bootstrap import read_token
from authz.policy import RETENTION_ACTOR_ID
from infra.ledger import ledger_head
from infra.projections import checkpoint
from infra.requester import CommandRequester
from infra.settings import RetentionSettings
from pamledger_client.client import MemoryClient
from retention.evaluator import evaluate, read_plan
from schemas.canonical import decode_json
from tests.conftest import (ACTOR, PROVENANCE, Env, Servers, admin_client, enforced_env, run_cli, serving,
                            wait_for)

POLICY_SCOPE = "workspace:ret.policy"  # expire_after_days = 30
PLAIN_SCOPE = "workspace:ret.plain"  # no retention policy
PAST = (datetime.now(timezone.utc) - timedelta(days=2)).isoformat()
FAR = (datetime.now(timezone.utc) + timedelta(days=3650)).isoformat()


@pytest.fixture(scope="module", autouse=True)
async def scopes(client: MemoryClient) -> None:
    await client.create_scope(POLICY_SCOPE, policy={"retention": {"expire_after_days": 30}})
    await client.create_scope(PLAIN_SCOPE)


async def claim(client: MemoryClient, scope: str = PLAIN_SCOPE, **optional: Any) -> dict[str, Any]:
    return await client.create(scope, "claim", {"statement": "the tide turns"}, ACTOR, PROVENANCE, **optional)


async def caught_up(env: Env) -> None:
    """The projection (what the evaluator reads) has applied every ledger entry written so far."""
    async with await psycopg.AsyncConnection.connect(env.database_url) as conn:
        head = await ledger_head(conn, env.settings.partition)

    async def applied() -> bool:
        async with await psycopg.AsyncConnection.connect(env.database_url) as conn:
            return await checkpoint(conn) >= head
    await wait_for(applied, timeout=30)


async def ledger_count(env: Env) -> int:
    async with await psycopg.AsyncConnection.connect(env.database_url) as conn:
        row = await (await conn.execute("SELECT count(*) FROM ledger")).fetchone()
        assert row is not None
        return int(row[0])


async def last_event(env: Env, object_id: str) -> dict[str, Any]:
    async with await psycopg.AsyncConnection.connect(env.database_url) as conn:
        row = await (await conn.execute("SELECT event FROM ledger WHERE object_id = %s ORDER BY ledger_sequence DESC"
                                        " LIMIT 1", (object_id,))).fetchone()
        assert row is not None
        return decode_json(bytes(row[0]))


async def run_round(env: Env, client: MemoryClient, now: datetime | None = None, scope_id: str | None = None,
                    dry_run: bool = False, token: str | None = None) -> Any:
    requester = None if dry_run else CommandRequester(client.nc, env.settings.subject_prefix, retries=0, token=token)
    async with await psycopg.AsyncConnection.connect(env.database_url, autocommit=True) as conn:
        return await evaluate(conn, requester, now or datetime.now(timezone.utc), scope_id)


async def test_past_valid_until_expires_with_lifecycle_unchanged_and_holds_are_never_proposed(
        client: MemoryClient, service: Env) -> None:
    past = await claim(client, valid_until=PAST, lifecycle_state="candidate")
    future = await claim(client, valid_until=FAR)
    held = await claim(client, valid_until=PAST)
    held = await client.transition(PLAIN_SCOPE, held["object_id"], held["version_id"], "retention", "legal_hold",
                                   ACTOR, PROVENANCE, policy_basis="policy:litigation:1")
    gone = await claim(client, valid_until=PAST)
    await client.delete(PLAIN_SCOPE, gone["object_id"], gone["version_id"], ACTOR, PROVENANCE)
    await caught_up(service)

    dry = await run_round(service, client, scope_id=PLAIN_SCOPE, dry_run=True)
    proposed = {p.object_id for p in dry.proposals}
    assert past["object_id"] in proposed
    assert not proposed & {future["object_id"], held["object_id"], gone["object_id"]}

    done = await run_round(service, client, scope_id=PLAIN_SCOPE)
    assert done.expired == len(done.proposals) >= 1 and not done.failed and not done.skipped
    expired = await client.read(PLAIN_SCOPE, past["object_id"])
    assert expired["retention_state"] == "expired"
    assert expired["lifecycle_state"] == "candidate"  # expiration never moves lifecycle
    assert expired["sequence"] == past["sequence"] + 1
    event = await last_event(service, past["object_id"])
    assert event["event_type"] == "retention_transitioned"
    assert event["actor"] == {"actor_id": RETENTION_ACTOR_ID, "actor_kind": "service"}
    assert event["payload"]["policy_basis"] == "retention:valid_until"
    assert (event["payload"]["from"], event["payload"]["to"]) == ("retained", "expired")
    still = await client.read(PLAIN_SCOPE, held["object_id"])
    assert (still["version_id"], still["retention_state"]) == (held["version_id"], "legal_hold")

    await caught_up(service)
    again = await run_round(service, client, scope_id=PLAIN_SCOPE)
    assert past["object_id"] not in {p.object_id for p in again.proposals}  # expired is not proposed again


async def test_an_object_brought_back_to_retained_is_not_expired_again(client: MemoryClient, service: Env) -> None:
    """Expired, then restored to retained by a person: the evaluator respects that and proposes it no more."""
    made = await claim(client, valid_until=PAST)
    await caught_up(service)
    await run_round(service, client, scope_id=PLAIN_SCOPE)
    expired = await client.read(PLAIN_SCOPE, made["object_id"])
    assert expired["retention_state"] == "expired"
    await client.transition(PLAIN_SCOPE, made["object_id"], expired["version_id"], "retention", "retained",
                            ACTOR, PROVENANCE)
    await caught_up(service)
    again = await run_round(service, client, scope_id=PLAIN_SCOPE, dry_run=True)
    assert made["object_id"] not in {p.object_id for p in again.proposals}


async def test_many_proposals_are_sent_together(client: MemoryClient, service: Env) -> None:
    """Sent concurrently, many expirations share commits: all land, none is refused."""
    made = [await claim(client, valid_until=PAST) for _ in range(80)]
    await caught_up(service)
    done = await run_round(service, client, scope_id=PLAIN_SCOPE)
    assert done.expired == len(done.proposals) >= len(made) and not done.failed and not done.skipped
    for m in made[::20]:
        assert (await client.read(PLAIN_SCOPE, m["object_id"]))["retention_state"] == "expired"


async def test_a_dry_run_writes_nothing(client: MemoryClient, service: Env) -> None:
    await claim(client, valid_until=PAST)
    await caught_up(service)
    before = await ledger_count(service)
    dry = await run_round(service, client, dry_run=True)
    assert dry.proposals and dry.expired == 0
    assert dry.counts()["dry_run"] is True and "expired" not in dry.counts()
    assert await ledger_count(service) == before


async def test_the_scope_policy_expires_objects_older_than_its_days(client: MemoryClient, service: Env) -> None:
    young = await claim(client, POLICY_SCOPE, valid_until=FAR)
    elsewhere = await claim(client, PLAIN_SCOPE, valid_until=FAR)
    await caught_up(service)
    now = datetime.now(timezone.utc)
    assert young["object_id"] not in {p.object_id for p in (await run_round(
        service, client, now, dry_run=True)).proposals}
    later = now + timedelta(days=31)  # the evaluator's clock is an input: a month on, the object is old
    done = await run_round(service, client, later)
    basis = {p.object_id: p.policy_basis for p in done.proposals}
    assert basis[young["object_id"]] == "retention:scope-policy:expire_after_days=30"
    assert elsewhere["object_id"] not in basis  # its scope has no retention policy
    read = await client.read(POLICY_SCOPE, young["object_id"])
    assert (read["retention_state"], read["lifecycle_state"]) == ("expired", "active")


async def test_an_object_that_moved_is_skipped_and_taken_next_round(client: MemoryClient, service: Env) -> None:
    made = await claim(client, valid_until=PAST)
    await caught_up(service)
    async with await psycopg.AsyncConnection.connect(service.database_url, autocommit=True) as conn:
        proposals, _ = await read_plan(conn, datetime.now(timezone.utc), PLAIN_SCOPE)
    mine = [p for p in proposals if p.object_id == made["object_id"]]
    assert mine and mine[0].expected_version_id == made["version_id"]
    moved = await client.update(PLAIN_SCOPE, made["object_id"], made["version_id"], {"statement": "the tide"},
                                ACTOR, PROVENANCE)
    from retention.evaluator import Round, send
    stale = Round(datetime.now(timezone.utc), False, mine, ())
    await send(CommandRequester(client.nc, service.settings.subject_prefix, retries=0), mine, stale)
    assert (stale.expired, stale.skipped, stale.failed) == (0, {"version_conflict": 1}, {})
    await caught_up(service)
    done = await run_round(service, client, scope_id=PLAIN_SCOPE)
    assert made["object_id"] in {p.object_id for p in done.proposals}
    read = await client.read(PLAIN_SCOPE, made["object_id"])
    assert read["sequence"] == moved["sequence"] + 1 and read["retention_state"] == "expired"


async def test_the_cli_proposes_in_a_dry_run_and_sends_otherwise(client: MemoryClient, service: Env) -> None:
    scope = "workspace:ret.cli"
    await client.create_scope(scope)
    made = await claim(client, scope, valid_until=PAST)
    await caught_up(service)
    before = await ledger_count(service)
    dry = await asyncio.to_thread(run_cli, service, "retention", "evaluate", "--scope", scope, "--dry-run")
    assert dry.returncode == 0, dry.stderr
    report = json.loads(dry.stdout)
    assert (report["dry_run"], report["proposed"], report["by_rule"]["valid_until"]) == (True, 1, 1)
    assert report["proposals"][0]["object_id"] == made["object_id"]
    assert await ledger_count(service) == before
    sent = await asyncio.to_thread(run_cli, service, "retention", "evaluate", "--scope", scope)
    assert sent.returncode == 0, sent.stderr
    report = json.loads(sent.stdout)
    assert (report["dry_run"], report["proposed"], report["expired"], report["failed"]) == (False, 1, 1, {})
    assert (await client.read(scope, made["object_id"]))["retention_state"] == "expired"


async def test_the_retention_role_evaluates_every_round(client: MemoryClient, service: Env) -> None:
    scope = "workspace:ret.role"
    await client.create_scope(scope)
    first = await claim(client, scope, valid_until=PAST)
    await caught_up(service)
    settings = service.settings.model_copy(update={"retention": RetentionSettings(enabled=True, every_seconds=0.5)})
    role_env = dataclasses.replace(service, settings=settings)
    async with serving(role_env, ready=("retention",), roles=("retention",)) as role_client:

        async def expired(object_id: str) -> bool:
            return bool((await client.read(scope, object_id))["retention_state"] == "expired")
        await wait_for(lambda: expired(first["object_id"]), timeout=30)
        second = await claim(client, scope, valid_until=PAST)  # made after the first round: a later one takes it
        await wait_for(lambda: expired(second["object_id"]), timeout=30)
        status = await role_client.status("retention")
        assert status["leader"] is True and "proposed" in status["last_round"]


# ---- auth enforced: the role's credential is the service's own, its actor the retention actor --------------
@pytest.fixture(scope="module")
async def enforced(servers: Servers, tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[tuple[Env, Any]]:
    env = enforced_env(servers, tmp_path_factory.mktemp("retention_auth"), "retauth")
    async with serving(env):
        admin = await admin_client(env)
        try:
            yield env, admin
        finally:
            await admin.close()


ADMIN = {"actor_id": "actor:pamledger:admin", "actor_kind": "operator"}


async def test_with_auth_enforced_the_service_credential_expires_as_the_retention_actor(
        enforced: tuple[Env, Any]) -> None:
    env, admin = enforced
    await admin.create_scope("team:ret:one")
    made = await admin.create("team:ret:one", "claim", {"statement": "s"}, ADMIN,
                              {"provenance_id": "prov:ret:1", "actor": ADMIN, "activity": "test"}, valid_until=PAST)
    await caught_up(env)
    assert env.settings.auth.service_token_file is not None
    token = read_token(env.settings.auth.service_token_file)
    done = await run_round(env, admin, token=token)
    assert (done.expired, done.failed) == (1, {})
    assert (await admin.read("team:ret:one", made["object_id"]))["retention_state"] == "expired"
    # the same credential cannot send a transition in another actor's name
    await caught_up(env)
    other = await admin.create("team:ret:one", "claim", {"statement": "t"}, ADMIN,
                               {"provenance_id": "prov:ret:2", "actor": ADMIN, "activity": "test"})
    requester = CommandRequester(admin.nc, env.settings.subject_prefix, retries=0, token=token)
    from schemas.errors import PamledgerError
    with pytest.raises(PamledgerError) as err:
        await requester.command("transition", {
            "scope_id": "team:ret:one", "object_id": other["object_id"], "expected_version_id": other["version_id"],
            "dimension": "retention", "target_state": "expired", "actor": ADMIN, "policy_basis": "x",
            "provenance": {"provenance_id": "prov:ret:3", "actor": ADMIN, "activity": "test"}})
    assert err.value.code == "access_denied"
