"""Subscribe never wedges silently and one bad thing stops nothing: an event a subscription's delivery
cannot get past, an event the partition feed cannot decode, a stored subscription that does not decode.

Why: an exception in a push pump other than a NATS error (an authorizer bug, a decode error) ended that
subscription's task silently, leaving it 'open' and delivering nothing; the same in the live feed, or a
stored request that no longer decodes, crash-looped the whole gateway. Now each is logged once, shown in
status (the subscription's and the gateway's), retried with backoff, and never skipped.
"""

from __future__ import annotations

import asyncio
from typing import Any

import psycopg
import pytest

from pamledger_client.protocol.subjects import scope_token
from pamledger_client.client import MemoryClient, PamspecError
from tests.conftest import ACTOR, PROVENANCE, Env, fresh_database, fresh_settings, running_service, wait_for

SCOPE = "workspace:sub-stuck"
FAST_RETRY = {"follower": {"retry_first_seconds": 0.05, "retry_max_seconds": 0.5}}


def fresh_env(servers: Any, label: str) -> Env:
    return Env(servers, fresh_database(servers, label), fresh_settings(label, **FAST_RETRY))


class Buggy:
    """An authorizer with a bug the test switches on and off: while on, it raises for created objects."""

    def __init__(self) -> None:
        self.broken = False

    def allows(self, actor: dict[str, Any], scope_id: str, event: dict[str, Any]) -> bool:
        if self.broken and event.get("event_type") == "object_created":
            raise RuntimeError("authorizer bug")
        return event["scope_id"] == scope_id


async def make(client: MemoryClient, label: str) -> dict[str, Any]:
    return await client.create(SCOPE, "claim", {label: True}, ACTOR, PROVENANCE)


async def sub_status(client: MemoryClient, subscription_id: str) -> dict[str, Any]:
    return await client.subscription_request("status", {"subscription_id": subscription_id})


async def test_an_event_delivery_cannot_get_past_parks_the_subscription_visibly_and_is_never_skipped(
        servers: Any) -> None:
    env, authorizer = fresh_env(servers, "stuckpump"), Buggy()
    async with running_service(env, authorizer):
        client = await MemoryClient.connect(env.nats_url, env.settings.subject_prefix)
        await client.create_scope(SCOPE)
        sub = await client.subscribe(SCOPE, ACTOR, filter={"event_classes": ["object_created"]})
        received: list[dict[str, Any]] = []

        async def read() -> None:
            async for event in sub:
                received.append(event)

        reader = asyncio.create_task(read())
        try:
            ok = await make(client, "ok")
            await wait_for(lambda: len(received) == 1, timeout=60)
            authorizer.broken = True
            boom = await make(client, "boom")
            after = await make(client, "after")

            async def stuck_at_boom() -> bool:
                stuck = (await sub_status(client, sub.subscription_id)).get("stuck")
                return bool(stuck) and stuck["sequence"] == boom["ledger_sequence"]

            await wait_for(stuck_at_boom, timeout=60, interval=0.1)
            report = (await sub_status(client, sub.subscription_id))["stuck"]
            assert "RuntimeError: authorizer bug" in report["reason"]
            gateway = await client.status("gateway")
            assert gateway["stuck_subscriptions"][sub.subscription_id]["sequence"] == boom["ledger_sequence"]
            assert [e["event"]["object_id"] for e in received] == [ok["object_id"]]  # nothing past it

            authorizer.broken = False  # the bug is fixed: delivery goes on from the event it stood at
            await wait_for(lambda: len(received) >= 3, timeout=60)
            assert [e["event"]["object_id"] for e in received] == \
                [ok["object_id"], boom["object_id"], after["object_id"]]
            await wait_for(lambda: _not_stuck(client, sub.subscription_id), timeout=30)
            assert (await client.status("gateway"))["stuck_subscriptions"] == {}
        finally:
            reader.cancel()
            await sub.close()
            await client.close()


async def _not_stuck(client: MemoryClient, subscription_id: str) -> bool:
    return (await sub_status(client, subscription_id))["stuck"] is None


async def test_an_event_the_feed_cannot_decode_is_reported_stuck_and_the_gateway_serves_on(servers: Any) -> None:
    env = fresh_env(servers, "stuckfeed")
    async with running_service(env):
        client = await MemoryClient.connect(env.nats_url, env.settings.subject_prefix)
        await client.create_scope(SCOPE)
        sub = await client.subscribe(SCOPE, ACTOR, filter={"event_classes": ["object_created"]})
        ok = await make(client, "ok")
        first = await asyncio.wait_for(sub.__aiter__().__anext__(), 60)  # it is in the stream, and live
        assert first["event"]["object_id"] == ok["object_id"]
        await wait_for(lambda: _live(client), timeout=60)
        js = client.nc.jetstream()
        subject = f"{env.settings.subject_prefix}.ledger.p{env.settings.partition}.{scope_token(SCOPE)}.object_created"
        bad = (await js.publish(subject, b"\xffnot json", stream=env.settings.stream_name)).seq

        async def feed_stuck() -> dict[str, Any] | None:
            stuck = (await client.status("gateway")).get("stuck")
            return stuck if stuck and stuck["sequence"] == bad else None

        stuck = await wait_for(feed_stuck, timeout=60, interval=0.1)
        pid = (await client.status("gateway"))["pid"]
        await asyncio.sleep(0)
        # It retries with backoff and stays stuck there (never skips), while the gateway answers requests.
        later = await wait_for(lambda: _attempts_past(client, stuck["attempts"]), timeout=30, interval=0.1)
        assert later["stuck"]["sequence"] == bad and later["pid"] == pid
        assert (await sub_status(client, sub.subscription_id))["subscription_id"] == sub.subscription_id

        await js.delete_msg(env.settings.stream_name, bad)  # the operator removes it: the feed moves on
        await wait_for(lambda: _feed_moving(client), timeout=60, interval=0.1)
        await sub.close()
        await client.close()


async def _live(client: MemoryClient) -> bool:
    return int((await client.status("gateway"))["live_subscriptions"]) == 1


async def _attempts_past(client: MemoryClient, attempts: int) -> dict[str, Any] | None:
    status = await client.status("gateway")
    return status if status.get("stuck") and status["stuck"]["attempts"] > attempts else None


async def _feed_moving(client: MemoryClient) -> bool:
    return (await client.status("gateway"))["stuck"] is None


async def test_a_stored_subscription_that_does_not_decode_is_reported_and_the_others_are_taken_over(
        servers: Any) -> None:
    env = fresh_env(servers, "stuckrow")
    async with running_service(env):
        client = await MemoryClient.connect(env.nats_url, env.settings.subject_prefix)
        await client.create_scope(SCOPE)
        head = (await make(client, "first"))["ledger_sequence"]
        good = (await client.subscription_request("open", {
            "scope_id": SCOPE, "actor": ACTOR, "after_sequence": head, "delivery": {"mode": "poll"},
            "filter": {"event_classes": ["object_created"]}}))
        await client.close()
    async with await psycopg.AsyncConnection.connect(env.database_url, autocommit=True) as conn:
        await conn.execute("INSERT INTO subscriptions (subscription_id, scope_id, request, start_sequence)"
                           " VALUES ('sub:unreadable', %s, %s, 0)", (SCOPE, b'{"scope_id": 7'))
    async with running_service(env):  # the gateway starts and serves (it used to crash-loop here)
        client = await MemoryClient.connect(env.nats_url, env.settings.subject_prefix)
        status = await client.status("gateway")
        assert "sub:unreadable" in status["unreadable_subscriptions"]
        assert status["open_subscriptions"] == 1
        made = await make(client, "second")
        got = await client.subscription_request("poll", {"subscription_id": good["subscription_id"], "wait_ms": 10000})
        assert [e["event"]["object_id"] for e in got["events"]] == [made["object_id"]]
        await client.close()


async def test_a_poll_that_cannot_get_past_an_event_fails_visibly_and_the_next_poll_reads_it_again(
        servers: Any) -> None:
    env, authorizer = fresh_env(servers, "stuckpoll"), Buggy()
    async with running_service(env, authorizer):
        client = await MemoryClient.connect(env.nats_url, env.settings.subject_prefix)
        await client.create_scope(SCOPE)
        head = (await make(client, "first"))["ledger_sequence"]
        polled = (await client.subscription_request("open", {
            "scope_id": SCOPE, "actor": ACTOR, "after_sequence": head, "delivery": {"mode": "poll"},
            "filter": {"event_classes": ["object_created"]}}))["subscription_id"]
        authorizer.broken = True
        boom = await make(client, "boom")
        with pytest.raises(PamspecError) as err:
            await client.subscription_request("poll", {"subscription_id": polled, "wait_ms": 10000})
        assert err.value.code == "internal_error"
        stuck = (await sub_status(client, polled))["stuck"]
        assert stuck["sequence"] == boom["ledger_sequence"] and "authorizer bug" in stuck["reason"]
        authorizer.broken = False
        got = await client.subscription_request("poll", {"subscription_id": polled, "wait_ms": 10000})
        assert [e["event"]["object_id"] for e in got["events"]] == [boom["object_id"]]  # not skipped
        assert (await sub_status(client, polled))["stuck"] is None
        await client.close()
