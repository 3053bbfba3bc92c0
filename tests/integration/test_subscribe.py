"""Subscribe: catch-up then live with no gap, filters, poll, close, bad input, per-event authorization."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

import psycopg
import pytest

from pamledger_client.client import MemoryClient, PamspecError
from tests.conftest import ACTOR, PROVENANCE, Env, fresh_database, fresh_settings, running_service, take, wait_for

pytestmark = pytest.mark.profile("PAMSPEC-Subscribe")  # docs/implementation-report.md

SCOPE = "workspace:subs"


@pytest.fixture(scope="module", autouse=True)
async def scope(client: MemoryClient) -> None:
    await client.create_scope(SCOPE)


async def make(client: MemoryClient, count: int, object_type: str = "claim", scope: str = SCOPE) -> list[dict[str, Any]]:
    return [await client.create(scope, object_type, {"n": i}, ACTOR, PROVENANCE) for i in range(count)]


async def test_catch_up_then_live_without_gap_or_reordering(client: MemoryClient) -> None:
    before = await make(client, 15)
    start = before[0]["ledger_sequence"] - 1
    sub = await client.subscribe(SCOPE, ACTOR, after_sequence=start, filter={"event_classes": ["object_created"]})
    writer = asyncio.create_task(make(client, 10))
    events = await take(sub, 25)
    after = await writer
    sequences = [e["ledger_sequence"] for e in events]
    assert sequences == sorted(sequences) and len(set(sequences)) == 25
    assert [e["event"]["object_id"] for e in events] == [o["object_id"] for o in before + after]
    assert all(e["event"]["event_type"] == "object_created" for e in events)
    await sub.close()


async def test_without_after_sequence_only_new_events_arrive(client: MemoryClient) -> None:
    await make(client, 3)
    sub = await client.subscribe(SCOPE, ACTOR, filter={"event_classes": ["object_created"]})
    fresh = await make(client, 2)
    events = await take(sub, 2)
    assert [e["event"]["object_id"] for e in events] == [o["object_id"] for o in fresh]
    await sub.close()


async def test_filters_by_object_type_object_id_and_predicate(client: MemoryClient) -> None:
    sub_type = await client.subscribe(SCOPE, ACTOR, filter={"object_type": "decision"})
    target = (await make(client, 1))[0]
    sub_id = await client.subscribe(SCOPE, ACTOR, filter={"object_id": target["object_id"]})
    sub_pred = await client.subscribe(SCOPE, ACTOR, filter={"predicate": {"payload.to": "corroborated"}})
    decisions = await make(client, 2, "decision")
    await make(client, 2)
    moved = await client.transition(SCOPE, target["object_id"], target["version_id"], "validation",
                                    "corroborated", ACTOR, PROVENANCE)
    assert [e["event"]["object_id"] for e in await take(sub_type, 2)] == [d["object_id"] for d in decisions]
    only = await take(sub_id, 1)
    assert only[0]["event"]["version_id"] == moved["version_id"]
    assert (await take(sub_pred, 1))[0]["event"]["event_type"] == "validation_transitioned"
    for sub in (sub_type, sub_id, sub_pred):
        await sub.close()


async def test_poll_returns_batches_and_acknowledges_them(client: MemoryClient) -> None:
    made = await make(client, 5)
    opened = await client.subscription_request("open", {
        "scope_id": SCOPE, "actor": ACTOR, "after_sequence": made[0]["ledger_sequence"] - 1,
        "filter": {"event_classes": ["object_created"]}, "delivery": {"mode": "poll"}})
    first = await client.subscription_request("poll", {"subscription_id": opened["subscription_id"], "max_events": 3})
    second = await client.subscription_request("poll", {"subscription_id": opened["subscription_id"], "max_events": 3})
    seen = [e["event"]["object_id"] for e in first["events"] + second["events"]]
    assert seen == [m["object_id"] for m in made]
    empty = await client.subscription_request("poll", {"subscription_id": opened["subscription_id"], "wait_ms": 100})
    assert empty["events"] == []


async def test_a_poll_waiting_for_events_holds_up_no_other_subscription(client: MemoryClient) -> None:
    """Each poll is answered in its own task: an idle subscription's long poll does not delay another's."""
    made = await make(client, 2)
    poll_mode = {"scope_id": SCOPE, "actor": ACTOR, "filter": {"event_classes": ["object_created"]},
                 "delivery": {"mode": "poll"}}
    idle = await client.subscription_request("open", poll_mode)  # from the tail: nothing to return
    busy = await client.subscription_request("open", {**poll_mode, "after_sequence": made[0]["ledger_sequence"] - 1})
    sent = client.nc.stats["out_msgs"]
    waiting = asyncio.create_task(client.subscription_request(
        "poll", {"subscription_id": idle["subscription_id"], "wait_ms": 3000}))
    try:
        await wait_for(lambda: client.nc.stats["out_msgs"] > sent)  # the waiting poll goes out first
        got = await client.subscription_request("poll", {"subscription_id": busy["subscription_id"], "max_events": 2})
        assert [e["event"]["object_id"] for e in got["events"]] == [m["object_id"] for m in made]
        assert not waiting.done()  # answered while the other poll still waits
    finally:
        assert (await waiting)["events"] == []


async def test_close_ends_delivery_and_is_in_the_ledger(client: MemoryClient, service: Env) -> None:
    sub = await client.subscribe(SCOPE, ACTOR)
    closed = await sub.close()
    assert closed["reason"] == "unsubscribed"
    with pytest.raises(PamspecError) as err:
        await client.subscription_request("resume", {"subscription_id": sub.subscription_id})
    assert err.value.code == "invalid_request"
    async with await psycopg.AsyncConnection.connect(service.database_url) as conn:
        cur = await conn.execute("SELECT event_type FROM ledger WHERE convert_from(event, 'UTF8') LIKE %s"
                                 " ORDER BY ledger_sequence", (f"%{sub.subscription_id}%",))
        assert [r[0] for r in await cur.fetchall()] == ["subscription_opened", "subscription_closed"]


@pytest.mark.parametrize("body", [
    {"filter": {"colour": "red"}}, {"after_sequence": -1}, {"after_sequence": 10**9},
    {"delivery": {"backpressure_policy": "ignore_and_hope"}}, {"unknown": 1},
], ids=["unknown-filter-key", "negative-after", "future-after", "bad-backpressure", "unknown-field"])
async def test_bad_subscribe_requests_are_invalid_request(client: MemoryClient, body: dict[str, Any]) -> None:
    with pytest.raises(PamspecError) as err:
        await client.subscription_request("open", {"scope_id": SCOPE, "actor": ACTOR, **body})
    assert err.value.code == "invalid_request"


async def test_unknown_subscription_and_undelivered_acks_are_invalid_request(client: MemoryClient,
                                                                             service: Env) -> None:
    for name, body in (("poll", {"subscription_id": "sub:nope"}),
                       ("ack", {"subscription_id": "sub:nope", "ledger_sequence": 1})):
        with pytest.raises(PamspecError) as err:
            await client.subscription_request(name, body)
        assert err.value.code == "invalid_request"
    sub = await client.subscribe(SCOPE, ACTOR)
    with pytest.raises(PamspecError) as err:
        await client.subscription_request("ack", {"subscription_id": sub.subscription_id,
                                                  "ledger_sequence": 10**8})
    assert err.value.code == "invalid_request"
    await sub.close()


async def test_unknown_scope_is_scope_not_found(client: MemoryClient) -> None:
    with pytest.raises(PamspecError) as err:
        await client.subscription_request("open", {"scope_id": "workspace:none", "actor": ACTOR})
    assert err.value.code == "scope_not_found"


class Revocable:
    """An authorizer the test flips mid-stream: the seam the authorization issue will fill."""

    def __init__(self) -> None:
        self.revoked: set[str] = set()
        self.asked = 0

    def allows(self, actor: dict[str, Any], scope_id: str, event: dict[str, Any]) -> bool:
        self.asked += 1
        return actor["actor_id"] not in self.revoked and event["scope_id"] == scope_id


async def test_revoking_access_mid_stream_stops_delivery_and_closes(servers: Any) -> None:
    env = Env(servers, fresh_database(servers, "revoke"), fresh_settings("revoke"))
    authorizer = Revocable()
    async with running_service(env, authorizer):
        client = await MemoryClient.connect(env.nats_url, env.settings.subject_prefix)
        await client.create_scope(SCOPE)
        sub = await client.subscribe(SCOPE, ACTOR, filter={"event_classes": ["object_created"]})
        allowed = await make(client, 3)
        got = await take(sub, 3)
        assert [e["event"]["object_id"] for e in got] == [a["object_id"] for a in allowed]
        authorizer.revoked.add(ACTOR["actor_id"])
        await make(client, 3)
        leftover = await take(sub, 1, timeout=30) if sub.closed is None else []
        assert leftover == []
        assert sub.closed is not None and sub.closed["reason"] == "access_revoked"
        assert sub.closed["last_delivered_sequence"] == allowed[-1]["ledger_sequence"]
        assert authorizer.asked >= 4
        await client.close()


async def test_the_cli_tails_a_scope_as_json_lines(client: MemoryClient, service: Env) -> None:
    import json
    import os
    import sys
    from pathlib import Path

    made = await make(client, 2)
    env = {**os.environ, "PAMLEDGER_NATS_URL": service.nats_url, "PAMLEDGER_DATABASE_URL": service.database_url,
           "PAMLEDGER_SUBJECT_PREFIX": service.settings.subject_prefix, "PAMLEDGER_LOG_FORMAT": "json"}
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "pamledger_client", "subscribe", SCOPE, "--after", str(made[0]["ledger_sequence"] - 1),
        "--event-class", "object_created", "--close-on-exit", cwd=Path(__file__).resolve().parents[2], env=env,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.DEVNULL)
    assert proc.stdout is not None
    lines = [json.loads(await asyncio.wait_for(proc.stdout.readline(), 60)) for _ in range(2)]
    assert [line["event"]["object_id"] for line in lines] == [m["object_id"] for m in made]
    proc.send_signal(2)
    assert await asyncio.wait_for(proc.wait(), 60) == 0


@contextlib.asynccontextmanager
async def tuned_client(servers: Any, label: str, **gateway: Any) -> AsyncIterator[MemoryClient]:
    """A client of a service of its own, with these gateway settings (and the test scope)."""
    env = Env(servers, fresh_database(servers, label), fresh_settings(label, gateway=gateway))
    async with running_service(env):
        client = await MemoryClient.connect(env.nats_url, env.settings.subject_prefix)
        try:
            await client.create_scope(SCOPE)
            yield client
        finally:
            await client.close()


async def test_a_slow_subscriber_whose_live_buffer_overflows_still_gets_every_event_once_in_order(
        servers: Any) -> None:
    """At max_unacked (policy block) live events queue in the session's buffer; past its limit they are
    dropped and read back from the stream. The raw protocol shows no gap, duplicate or reordering."""
    async with tuned_client(servers, "overflow", live_buffer_events=3) as client:
        await _overflow_and_read_back(client)


async def _overflow_and_read_back(client: MemoryClient) -> None:
    import msgspec

    opened = await client.subscription_request("open", {
        "scope_id": SCOPE, "actor": ACTOR, "filter": {"event_classes": ["object_created"]},
        "delivery": {"mode": "push", "max_unacked": 2, "backpressure_policy": "block"}})
    pushes: asyncio.Queue[dict[str, Any]] = asyncio.Queue()

    async def on_push(msg: Any) -> None:
        await pushes.put(msgspec.json.decode(msg.data))

    raw = await client.nc.subscribe(opened["delivery_subject"], cb=on_push)
    created = await make(client, 25)  # all written before the subscriber acks anything
    got: list[dict[str, Any]] = []
    while len(got) < len(created):
        push = await asyncio.wait_for(pushes.get(), 60)
        if push["type"] != "event":
            continue
        assert push["generation"] == opened["generation"]
        assert push["previous_sequence"] == (got[-1]["ledger_sequence"] if got else opened["start_sequence"])
        got.append(push)
        await client.subscription_request("ack", {"subscription_id": opened["subscription_id"],
                                                  "ledger_sequence": push["ledger_sequence"]})
    assert [p["event"]["object_id"] for p in got] == [o["object_id"] for o in created]
    await raw.unsubscribe()
    await client.subscription_request("close", {"subscription_id": opened["subscription_id"], "reason": "unsubscribed"})


async def test_a_retried_open_returns_the_subscription_the_first_attempt_made(client: MemoryClient,
                                                                             service: Env) -> None:
    body = {"scope_id": SCOPE, "actor": ACTOR, "operation_id": "op:test-retried-open",
            "delivery": {"mode": "poll"}}
    first = await client.subscription_request("open", body)
    again = await client.subscription_request("open", body)
    assert again["subscription_id"] == first["subscription_id"]
    assert again["start_sequence"] == first["start_sequence"]
    with pytest.raises(PamspecError) as err:
        await client.subscription_request("open", {**body, "filter": {"object_type": "claim"}})
    assert err.value.code == "duplicate_operation"
    async with await psycopg.AsyncConnection.connect(service.database_url) as conn:
        cur = await conn.execute("SELECT count(*) FROM subscriptions WHERE operation_id = %s",
                                 ("op:test-retried-open",))
        assert (await cur.fetchone()) == (1,)
    await client.subscription_request("close", {"subscription_id": first["subscription_id"]})


async def test_a_close_left_unfinished_by_a_dead_gateway_is_finished_by_the_next_and_never_resumed(
        servers: Any) -> None:
    """The gateway marks a subscription 'closing' before it writes subscription_closed; if it dies (or the
    writer is away) in between, the next leader writes the entry and does not deliver again."""
    env = Env(servers, fresh_database(servers, "closing"), fresh_settings("closing"))
    async with running_service(env):
        client = await MemoryClient.connect(env.nats_url, env.settings.subject_prefix)
        await client.create_scope(SCOPE)
        opened = await client.subscription_request("open", {"scope_id": SCOPE, "actor": ACTOR})
        await client.close()
    async with await psycopg.AsyncConnection.connect(env.database_url, autocommit=True) as conn:
        await conn.execute("UPDATE subscriptions SET status = 'closing', close_reason = 'unsubscribed'"
                           " WHERE subscription_id = %s", (opened["subscription_id"],))
        async with running_service(env):
            client = await MemoryClient.connect(env.nats_url, env.settings.subject_prefix)

            async def closed() -> bool:
                cur = await conn.execute("SELECT status FROM subscriptions WHERE subscription_id = %s",
                                         (opened["subscription_id"],))
                return (await cur.fetchone()) == ("closed",)

            await wait_for(closed, timeout=30)
            with pytest.raises(PamspecError) as err:
                await client.subscription_request("status", {"subscription_id": opened["subscription_id"]})
            assert err.value.code == "invalid_request"
            await client.close()
        cur = await conn.execute("SELECT event_type FROM ledger WHERE convert_from(event, 'UTF8') LIKE %s"
                                 " ORDER BY ledger_sequence", (f"%{opened['subscription_id']}%",))
        assert [r[0] for r in await cur.fetchall()] == ["subscription_opened", "subscription_closed"]


async def test_the_feed_pauses_without_subscribers_and_a_later_subscription_misses_nothing(servers: Any) -> None:
    """With no push subscription the gateway stops reading the stream; a subscription opened later catches
    up over what was written meanwhile and joins the restarted feed without a gap."""
    async with tuned_client(servers, "pause", feed_pause_after_seconds=0.2) as client:
        await _pause_and_resume(client)


async def _pause_and_resume(client: MemoryClient) -> None:
    first = await client.subscribe(SCOPE, ACTOR, filter={"event_classes": ["object_created"]})
    await make(client, 1)
    await take(first, 1)
    await first.close()

    async def paused() -> bool:
        return not (await client.status("gateway"))["feed_following"]

    await wait_for(paused, timeout=30)
    while_paused = await make(client, 5)
    start = while_paused[0]["ledger_sequence"] - 1
    sub = await client.subscribe(SCOPE, ACTOR, after_sequence=start, filter={"event_classes": ["object_created"]})
    later = asyncio.create_task(make(client, 10))
    events = await take(sub, 15)
    expected = while_paused + await later
    assert [e["event"]["object_id"] for e in events] == [o["object_id"] for o in expected]
    assert (await client.status("gateway"))["feed_following"]
    await sub.close()


async def test_the_blocking_client_iterates_a_subscription_with_a_plain_for(client: MemoryClient,
                                                                           service: Env) -> None:
    from pamledger_client.client import SyncMemoryClient

    created = await make(client, 3)
    start = created[0]["ledger_sequence"] - 1

    def blocking() -> list[str]:
        sync = SyncMemoryClient(service.nats_url, service.settings.subject_prefix)
        try:
            sub = sync.subscribe(SCOPE, ACTOR, after_sequence=start, filter={"event_classes": ["object_created"]})
            got = []
            for event in sub:
                got.append(event["event"]["object_id"])
                if len(got) == 3:
                    break
            assert sub.close()["reason"] == "unsubscribed"
            return got
        finally:
            sync.close()

    assert await asyncio.wait_for(asyncio.to_thread(blocking), 60) == [o["object_id"] for o in created]
