"""Query over the projection: filters, full text, ordering, cursors, freshness and time travel."""

from __future__ import annotations

import asyncio
import contextlib
import json
import subprocess
import sys
from typing import Any

import msgspec
import pytest

from pamledger_client.protocol.subjects import query_subject
from pamledger_client.client import MemoryClient, PamspecError
from tests.conftest import (
    ACTOR, PROVENANCE, ROOT, Env, Servers, fresh_database, fresh_settings, run_cli, running_service,
    service_environment, wait_for,
)

pytestmark = pytest.mark.profile("PAMSPEC-Structured-Query")  # docs/implementation-report.md

SCOPE = "workspace:query"
OTHER = "workspace:query-other"
OTHER_ACTOR = {"actor_id": "actor:human:reviewer", "actor_kind": "human"}


async def claim(client: MemoryClient, text: str, scope: str = SCOPE, corroborate: bool = True,
                **extra: Any) -> dict[str, Any]:
    actor = extra.pop("actor", ACTOR)
    created = await client.create(scope, "claim", {"statement": text}, actor, PROVENANCE, **extra)
    if not corroborate:
        return created
    return await client.transition(scope, created["object_id"], created["version_id"], "validation",
                                   "corroborated", actor, PROVENANCE)


@pytest.fixture(scope="module")
async def data(client: MemoryClient) -> dict[str, Any]:
    await client.create_scope(SCOPE)
    await client.create_scope(OTHER)
    made = {
        "cats": await claim(client, "cats chase mice in the barn", observed_at="2026-01-01T00:00:00Z"),
        "dogs": await claim(client, "dogs chase cats around the yard", observed_at="2026-03-01T00:00:00Z"),
        "rain": await claim(client, "rain falls on the plain", actor=OTHER_ACTOR),
        "draft": await claim(client, "cats are unverified here", corroborate=False),
        "elsewhere": await claim(client, "cats in another scope", scope=OTHER),
    }
    note = await client.create(SCOPE, "com.example.note", {"body": "cats note"}, ACTOR, PROVENANCE,
                               schema_id="https://example.com/note.json", validation_state="corroborated")
    made["note"] = note
    return made


def ids(result: dict[str, Any]) -> list[str]:
    return [item["envelope"]["object_id"] for item in result["items"]]


async def test_default_query_returns_the_trusted_target_newest_first(client: MemoryClient,
                                                                     data: dict[str, Any]) -> None:
    result = await client.query(SCOPE)
    assert ids(result) == [data[k]["object_id"] for k in ("note", "rain", "dogs", "cats")]
    assert result["as_of_sequence"] >= data["note"]["ledger_sequence"]
    assert result["min_sequence_reached"] is True


async def test_read_your_writes_through_the_sdk(client: MemoryClient, data: dict[str, Any]) -> None:
    fresh = await claim(client, "written just now")
    assert fresh["object_id"] in ids(await client.query(SCOPE))


async def test_filters_by_state_type_schema_actor_and_time(client: MemoryClient, data: dict[str, Any]) -> None:
    assert ids(await client.query(SCOPE, validation_states=["unverified"])) == [data["draft"]["object_id"]]
    assert ids(await client.query(SCOPE, object_types=["com.example.note"])) == [data["note"]["object_id"]]
    assert ids(await client.query(SCOPE, schema_ids=["https://example.com/note.json"])) == [data["note"]["object_id"]]
    assert ids(await client.query(SCOPE, actor_ids=[OTHER_ACTOR["actor_id"]])) == [data["rain"]["object_id"]]
    window = {"observed_at": {"gte": "2026-02-01T00:00:00Z", "lt": "2026-04-01T00:00:00Z"}}
    assert ids(await client.query(SCOPE, time=window)) == [data["dogs"]["object_id"]]
    seq = {"gte": data["cats"]["ledger_sequence"], "lte": data["cats"]["ledger_sequence"]}
    assert ids(await client.query(SCOPE, ledger_sequence=seq)) == [data["cats"]["object_id"]]


async def test_full_text_with_score_never_crosses_scopes(client: MemoryClient, data: dict[str, Any]) -> None:
    result = await client.query(SCOPE, text="cats", order="score")
    found = ids(result)
    assert set(found) == {data["cats"]["object_id"], data["dogs"]["object_id"], data["note"]["object_id"]}
    assert data["elsewhere"]["object_id"] not in found
    scores = [item["score"] for item in result["items"]]
    assert scores == sorted(scores, reverse=True) and all(s > 0 for s in scores)


async def test_ordering_by_a_time_field_puts_missing_values_last(client: MemoryClient,
                                                                 data: dict[str, Any]) -> None:
    found = ids(await client.query(SCOPE, order="observed_at_asc"))
    assert found[:2] == [data["cats"]["object_id"], data["dogs"]["object_id"]]


async def test_cursor_pages_cover_everything_once(client: MemoryClient, data: dict[str, Any]) -> None:
    everything = ids(await client.query(SCOPE, limit=500, order="observed_at_desc"))
    paged: list[str] = []
    cursor = None
    while True:
        page = await client.query(SCOPE, limit=2, order="observed_at_desc", **({"cursor": cursor} if cursor else {}))
        paged += ids(page)
        cursor = page["next_cursor"]
        if cursor is None:
            break
    assert paged == everything


async def test_a_cursor_from_another_query_is_invalid_request(client: MemoryClient, data: dict[str, Any]) -> None:
    page = await client.query(SCOPE, limit=1)
    with pytest.raises(PamspecError) as err:
        await client.query(SCOPE, limit=1, text="cats", cursor=page["next_cursor"])
    assert err.value.code == "invalid_request"


async def test_a_cursor_given_to_another_caller_or_changed_is_invalid_request(client: MemoryClient,
                                                                            data: dict[str, Any]) -> None:
    """Cursors are signed and bound to the caller they were given to (query.cursor): another actor holding
    one, or the same caller with a cursor whose body was changed, gets invalid_request."""
    mallory = {"actor_id": "actor:agent:mallory", "actor_kind": "agent"}
    page = await client.query(SCOPE, limit=1)
    cursor = page["next_cursor"]
    assert (await client.query(SCOPE, limit=1, cursor=cursor))["items"]  # its own caller pages on
    with pytest.raises(PamspecError) as err:
        await client.query(SCOPE, mallory, limit=1, cursor=cursor)
    assert err.value.code == "invalid_request" and "another caller" in str(err.value)
    body, key_id, mac = cursor.split(".")
    flipped = body[:-2] + ("A" if body[-2] != "A" else "B") + body[-1]
    with pytest.raises(PamspecError) as err:
        await client.query(SCOPE, limit=1, cursor=f"{flipped}.{key_id}.{mac}")
    assert err.value.code == "invalid_request" and "not a pamledger query cursor" in str(err.value)


async def test_a_cursor_outlives_a_key_rotation_by_the_grace_period_only(client: MemoryClient, service: Env,
                                                                         data: dict[str, Any]) -> None:
    """`pamledger cursor-keys rotate` beside the running service: a cursor signed before still pages, new
    cursors name the new key (the service re-reads the key file by itself); once the retired key is past its
    grace period (a second rotation with a grace of 0 drops every retired key), its cursors are refused."""
    before = (await client.query(SCOPE, limit=1))["next_cursor"]
    rotated = run_cli(service, "cursor-keys", "rotate")
    assert rotated.returncode == 0, rotated.stderr
    report = json.loads(rotated.stdout)
    assert "secret" not in rotated.stdout and len(report["keys"]) == 2

    async def signing_key() -> str:
        return str((await client.query(SCOPE, limit=1))["next_cursor"].split(".")[1])

    await wait_for(lambda: _named(signing_key(), report["signing_key_id"]))
    assert (await client.query(SCOPE, limit=1, cursor=before))["items"]  # within the grace period
    after = (await client.query(SCOPE, limit=1))["next_cursor"]
    again = subprocess.run([sys.executable, "-m", "pamledger", "cursor-keys", "rotate"], cwd=ROOT,
                           env=service_environment(service, PAMLEDGER_QUERY__CURSOR_KEY_GRACE_SECONDS="0"),
                           capture_output=True, text=True, timeout=120)
    assert again.returncode == 0, again.stderr
    assert before.split(".")[1] not in again.stdout  # dropped from the file

    async def refused() -> bool:
        try:
            await client.query(SCOPE, limit=1, cursor=before)
        except PamspecError as exc:
            return exc.code == "invalid_request"
        return False

    await wait_for(refused)
    with pytest.raises(PamspecError):  # retired by the second rotation, whose grace of 0 dropped it at once
        await client.query(SCOPE, limit=1, cursor=after)
    fresh = (await client.query(SCOPE, limit=1))["next_cursor"]
    assert (await client.query(SCOPE, limit=1, cursor=fresh))["items"]


async def _named(found: Any, key_id: str) -> bool:
    return await found == key_id


async def test_the_same_query_over_the_same_state_is_byte_identical(client: MemoryClient, service: Env,
                                                                    data: dict[str, Any]) -> None:
    subject = f"{service.settings.subject_prefix}.query.query"
    body = msgspec.json.encode({"scope_id": SCOPE, "text": "cats", "order": "score"})
    replies = [(await client.nc.request(subject, body, timeout=10)).data for _ in range(3)]
    assert replies[0] == replies[1] == replies[2]


async def test_a_query_waiting_for_the_projection_holds_up_no_other(client: MemoryClient,
                                                                     data: dict[str, Any]) -> None:
    """Requests are answered concurrently: while one waits (up to wait_ms) for a sequence the projection has
    not reached, others are answered."""
    sent = client.nc.stats["out_msgs"]
    waiting = asyncio.create_task(client.query(SCOPE, min_sequence=10**9, wait_ms=5000))
    try:
        await wait_for(lambda: client.nc.stats["out_msgs"] > sent)  # the waiting query goes out first
        for _ in range(3):
            assert ids(await client.query(SCOPE))
            read = await client.read(SCOPE, data["cats"]["object_id"])
            assert read["object_id"] == data["cats"]["object_id"]
            assert not waiting.done()  # still waiting: the answers above did not queue behind it
    finally:
        result = await waiting
    assert result["min_sequence_reached"] is False


async def test_past_the_in_flight_limit_a_request_is_refused_as_retryable(servers: Servers) -> None:
    env = Env(servers, fresh_database(servers, "inflight"), fresh_settings("inflight", query={"max_in_flight": 1}))
    async with running_service(env):
        client = await MemoryClient.connect(env.nats_url, env.settings.subject_prefix)
        await client.create_scope(SCOPE)
        subject = query_subject(client.prefix, "query")
        # The waiting query holds the one slot for 8 s (under the SDK's 10 s request timeout), so a loaded machine
        # has time to send the probe; it is cancelled once the probe was refused.
        waiting = asyncio.create_task(client.query(SCOPE, min_sequence=10**9, wait_ms=8_000))
        try:
            async def refused() -> bool:
                reply = await client.nc.request(subject, msgspec.json.encode({"scope_id": SCOPE}), timeout=10)
                error = msgspec.json.decode(reply.data).get("error")
                return (error is not None and error["code"] == "service_unavailable" and error["retryable"] is True
                        and error["details"] == {"limit": 1})

            await wait_for(refused, timeout=10)  # once the waiting query is in flight
        finally:
            waiting.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await waiting
            await client.close()


async def test_min_sequence_beyond_the_head_answers_with_its_freshness(client: MemoryClient,
                                                                       data: dict[str, Any]) -> None:
    result = await client.query(SCOPE, min_sequence=10**9, wait_ms=200)
    assert result["min_sequence_reached"] is False and result["as_of_sequence"] < 10**9


async def test_as_of_sequence_answers_from_versions(client: MemoryClient, data: dict[str, Any]) -> None:
    created = await client.create(SCOPE, "claim", {"statement": "time travel"}, ACTOR, PROVENANCE,
                                  validation_state="corroborated")
    before = created["ledger_sequence"]
    changed = await client.update(SCOPE, created["object_id"], created["version_id"], {"statement": "changed"},
                                  ACTOR, PROVENANCE)
    past = await client.query(SCOPE, as_of_sequence=before, text="travel")
    assert [i["envelope"]["version_id"] for i in past["items"]] == [created["version_id"]]
    assert past["as_of_sequence"] == before
    now = await client.query(SCOPE, text="changed")
    assert [i["envelope"]["version_id"] for i in now["items"]] == [changed["version_id"]]


async def test_deleted_content_leaves_the_full_text_index(client: MemoryClient, data: dict[str, Any]) -> None:
    secret = await claim(client, "zanzibar secret")
    await client.delete(SCOPE, secret["object_id"], secret["version_id"], ACTOR, PROVENANCE)
    everywhere = dict(lifecycle_states=["active"], availability_states=["available", "deleted"])
    assert ids(await client.query(SCOPE, text="zanzibar", **everywhere)) == []


@pytest.mark.parametrize("bad", [
    {"colour": "red"}, {"limit": 501}, {"limit": "ten"}, {"lifecycle_states": []},
    {"lifecycle_states": ["redacted"]}, {"order": "score"}, {"order": "sideways"},
    {"time": {"observed_at": {"gte": "2026-02-01T00:00:00Z", "lt": "2026-01-01T00:00:00Z"}}},
    {"ledger_sequence": {"gte": 5, "lte": 4}}, {"cursor": "garbage"},
], ids=lambda b: next(iter(b)))
async def test_bad_queries_are_invalid_request(client: MemoryClient, data: dict[str, Any], bad: dict[str, Any]) -> None:
    with pytest.raises(PamspecError) as err:
        await client.query(SCOPE, **bad)
    assert err.value.code == "invalid_request"


async def test_a_query_naming_no_scope_is_invalid_request(client: MemoryClient, service: Env) -> None:
    reply = await client.nc.request(f"{service.settings.subject_prefix}.query.query", b"{}", timeout=10)
    assert msgspec.json.decode(reply.data)["error"]["code"] == "invalid_request"


async def test_an_unknown_scope_is_scope_not_found(client: MemoryClient, data: dict[str, Any]) -> None:
    with pytest.raises(PamspecError) as err:
        await client.query("workspace:unknown")
    assert err.value.code == "scope_not_found"
