"""Subscribe requests at their edges: resume past the ledger head, resume without a position, poll after close.

Why: a resume past the head used to be accepted and then never delivered the events that followed, and a
poll of a closed subscription answered an error where PAMSPEC's conformance case expects no events.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest

from pamledger_client.client import MemoryClient, PamspecError
from tests.conftest import ACTOR, PROVENANCE

pytestmark = pytest.mark.profile("PAMSPEC-Subscribe")  # docs/implementation-report.md

SCOPE = "workspace:sub-requests"


@pytest.fixture(scope="module", autouse=True)
async def scope(client: MemoryClient) -> None:
    await client.create_scope(SCOPE)


async def make(client: MemoryClient, count: int) -> list[dict[str, Any]]:
    return [await client.create(SCOPE, "claim", {"n": i}, ACTOR, PROVENANCE) for i in range(count)]


async def open_poll(client: MemoryClient, after: int) -> str:
    opened = await client.subscription_request("open", {
        "scope_id": SCOPE, "actor": ACTOR, "after_sequence": after,
        "filter": {"event_classes": ["object_created"]}, "delivery": {"mode": "poll"}})
    return str(opened["subscription_id"])


async def poll(client: MemoryClient, subscription_id: str, wait_ms: int = 2000) -> dict[str, Any]:
    return await client.subscription_request("poll", {"subscription_id": subscription_id, "wait_ms": wait_ms})


async def test_a_resume_beyond_the_ledger_head_is_invalid_request_naming_the_head(client: MemoryClient) -> None:
    head = (await make(client, 1))[0]["ledger_sequence"]
    subscription_id = await open_poll(client, head)
    with pytest.raises(PamspecError) as err:
        await client.subscription_request("resume", {"subscription_id": subscription_id,
                                                     "after_sequence": head + 1000})
    assert err.value.code == "invalid_request"
    assert head <= err.value.details["ledger_head"] < head + 1000  # (opening wrote a ledger entry too)
    assert err.value.details["after_sequence"] == head + 1000
    made = await make(client, 2)  # the refused resume moved nothing: the next events still arrive
    got = await poll(client, subscription_id)
    assert [e["event"]["object_id"] for e in got["events"]] == [m["object_id"] for m in made]


async def test_a_resume_at_the_ledger_head_is_accepted(client: MemoryClient) -> None:
    subscription_id = await open_poll(client, (await make(client, 1))[0]["ledger_sequence"] - 1)
    head = (await client.subscription_request("poll", {"subscription_id": subscription_id}))["events"][0][
        "ledger_sequence"] + 1  # the subscription_opened entry came after the create
    resumed = await client.subscription_request("resume", {"subscription_id": subscription_id,
                                                           "after_sequence": head})
    assert resumed["resumed_after"] == head
    made = await make(client, 1)
    assert [e["event"]["object_id"] for e in (await poll(client, subscription_id))["events"]] == \
        [made[0]["object_id"]]


async def test_a_resume_without_a_position_restarts_after_the_acknowledged_one(client: MemoryClient) -> None:
    first = await make(client, 2)
    subscription_id = await open_poll(client, first[0]["ledger_sequence"] - 1)
    assert len((await poll(client, subscription_id))["events"]) == 2  # a poll acknowledges what it returns
    resumed = await client.subscription_request("resume", {"subscription_id": subscription_id})
    assert resumed["resumed_after"] == first[1]["ledger_sequence"]
    later = await make(client, 1)
    assert [e["event"]["object_id"] for e in (await poll(client, subscription_id))["events"]] == \
        [later[0]["object_id"]]


async def test_polling_a_closed_subscription_answers_no_events(client: MemoryClient) -> None:
    """PAMSPEC conformance case_close_stops_delivery: subscribe, close, write, poll -> []."""
    head = (await make(client, 1))[0]["ledger_sequence"]
    subscription_id = await open_poll(client, head)
    await client.subscription_request("close", {"subscription_id": subscription_id, "reason": "conformance_test"})
    await make(client, 1)
    for _ in range(2):  # and it stays so
        got = await poll(client, subscription_id, wait_ms=200)
        assert got["events"] == []
        assert got["closed"] is True
        assert got["last_delivered_sequence"] == head


async def test_polling_an_unknown_subscription_is_still_invalid_request(client: MemoryClient) -> None:
    with pytest.raises(PamspecError) as err:
        await poll(client, "sub:never-opened", wait_ms=100)
    assert err.value.code == "invalid_request"


async def test_an_unexpected_exception_answers_internal_error_and_the_gateway_serves_on(
    client: MemoryClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A bug hit by one request (injected into the gateway's own status handler) answers that request
    internal_error instead of leaving the caller to time out; the next request is served."""
    from subscriptions.gateway import Gateway

    head = (await make(client, 1))[0]["ledger_sequence"]
    subscription_id = await open_poll(client, head)

    async def broken_status(self: Gateway, request: Any) -> dict[str, Any]:
        raise RuntimeError("injected gateway bug")

    monkeypatch.setattr(Gateway, "_status", broken_status)
    with pytest.raises(PamspecError) as err:
        await client.subscription_request("status", {"subscription_id": subscription_id})
    assert err.value.code == "internal_error"
    monkeypatch.undo()
    assert (await client.subscription_request("status", {"subscription_id": subscription_id}))


async def close_entries(service: Any, subscription_id: str) -> list[str]:
    import psycopg

    async with await psycopg.AsyncConnection.connect(service.database_url) as conn:
        cur = await conn.execute("SELECT event_type FROM ledger WHERE event_type = 'subscription_closed'"
                                 " AND convert_from(event, 'UTF8') LIKE %s", (f"%{subscription_id}%",))
        return [r[0] for r in await cur.fetchall()]


async def test_a_nul_in_a_close_reason_is_invalid_request_and_leaves_the_subscription_open(
        client: MemoryClient, service: Any) -> None:
    """It used to stop delivery, then fail in Postgres: internal_error, a half-closed subscription that
    the next leader would resume, and a retried close answered 'unknown or closed subscription'."""
    head = (await make(client, 1))[0]["ledger_sequence"]
    subscription_id = await open_poll(client, head)
    with pytest.raises(PamspecError) as err:
        await client.subscription_request("close", {"subscription_id": subscription_id, "reason": "a\u0000b"})
    assert err.value.code == "invalid_request"
    assert err.value.details["field"] == "/reason"
    made = await make(client, 1)  # still open: it delivers
    assert [e["event"]["object_id"] for e in (await poll(client, subscription_id))["events"]] == [made[0]["object_id"]]
    closed = await client.subscription_request("close", {"subscription_id": subscription_id, "reason": "done"})
    assert closed["reason"] == "done"
    assert await close_entries(service, subscription_id) == ["subscription_closed"]
    again = await client.subscription_request("close", {"subscription_id": subscription_id, "reason": "done"})
    assert again["last_delivered_sequence"] == closed["last_delivered_sequence"]  # a repeated close: same answer


def nested(depth: int) -> Any:
    value: Any = 1
    for _ in range(depth):
        value = [value]
    return value


@pytest.mark.parametrize(("body", "field"), [
    ({"filter": {"predicate": {"envelope.x": "a\u0000b"}}}, "/filter/predicate/envelope.x"),
    ({"filter": {"object_type": "claim\u0000"}}, "/filter/object_type"),
    ({"filter": {"predicate": {"envelope.x": 1e999}}}, None),  # Infinity: the schema refuses it as out of range
    ({"filter": {"predicate": {"envelope.x": nested(70)}}}, None),  # predicate values are scalars
])
async def test_a_subscribe_request_with_a_value_no_store_can_hold_is_invalid_request_naming_it(
        client: MemoryClient, body: dict[str, Any], field: str | None) -> None:
    import msgspec

    payload = msgspec.json.encode({"scope_id": SCOPE, "actor": ACTOR, "delivery": {"mode": "poll"}, **body})
    payload = payload.replace(b'"envelope.x":null', b'"envelope.x":1e999')  # msgspec writes inf as null
    reply = msgspec.json.decode((await client.nc.request(f"{client.prefix}.sub.open", payload, timeout=10)).data)
    assert reply["error"]["code"] == "invalid_request", reply
    if field is not None:
        assert reply["error"]["details"]["field"] == field, reply


async def test_a_close_postgres_refuses_is_undone_and_delivery_goes_on_without_a_gap(
        client: MemoryClient, service: Any) -> None:
    """Any failure to mark the row other than a lost connection (here a real Postgres error from a trigger)
    undoes the close: the subscription is still open, and pushes every event, none twice."""
    import asyncio

    import psycopg

    async with await psycopg.AsyncConnection.connect(service.database_url, autocommit=True) as conn:
        await conn.execute(
            "CREATE FUNCTION refuse_close() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN"
            " IF NEW.close_reason = 'refused' THEN RAISE EXCEPTION 'close refused by test trigger'; END IF;"
            " RETURN NEW; END $$;"
            "CREATE TRIGGER refuse_close BEFORE UPDATE ON subscriptions FOR EACH ROW EXECUTE FUNCTION refuse_close()")
    first = (await make(client, 1))[0]
    sub = await client.subscribe(SCOPE, ACTOR, after_sequence=first["ledger_sequence"] - 1,
                                 filter={"event_classes": ["object_created"]})
    events = sub.__aiter__()
    assert (await asyncio.wait_for(events.__anext__(), 60))["event"]["object_id"] == first["object_id"]
    with pytest.raises(PamspecError):
        await client.subscription_request("close", {"subscription_id": sub.subscription_id, "reason": "refused"})
    assert (await client.subscription_request("status", {"subscription_id": sub.subscription_id}))
    made = await make(client, 3)
    got = [await asyncio.wait_for(events.__anext__(), 60) for _ in made]
    assert [e["event"]["object_id"] for e in got] == [m["object_id"] for m in made]
    await sub.close()


async def test_a_poll_its_client_gave_up_on_moves_nothing_past_the_resume_that_followed(client: MemoryClient) -> None:
    """A poll client whose answer was lost (its NATS node died) resumes after the last event it received
    and polls on: the poll it gave up on, still waiting at the gateway, must neither hold the resume up nor
    acknowledge past its position what it reads once the resume is done."""
    start = (await make(client, 1))[0]["ledger_sequence"]
    subscription_id = await open_poll(client, start)
    await poll(client, subscription_id, wait_ms=0)  # past the subscription_opened entry
    given_up = asyncio.create_task(poll(client, subscription_id, wait_ms=4000))
    await asyncio.sleep(0.5)  # it waits at the gateway for a first event
    began = time.monotonic()
    await client.subscription_request("resume", {"subscription_id": subscription_id, "after_sequence": start})
    assert time.monotonic() - began < 2.0, "the resume waited for the poll its client gave up on"
    made = await make(client, 2)
    await given_up  # its answer goes nowhere: the client resumed instead
    got = await poll(client, subscription_id)
    assert [e["event"]["object_id"] for e in got["events"]] == [m["object_id"] for m in made]
