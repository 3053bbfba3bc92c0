"""The gateway's tunables act where they should: a push subscription's live buffer holds at most
`gateway.live_buffer_events` (past it the buffer is dropped and the events read again from the stream), and
the partition feed pauses after `gateway.feed_pause_after_seconds` without a push subscription.

Why: the buffer limit is an operator's memory bound per subscription and the pause what an idle gateway
costs; both must be the configured values, not module constants."""

from __future__ import annotations

import time
import types

import msgspec

from infra.settings import GatewaySettings
from schemas.subscriptions import SubscribeRequest
from subscriptions.feed import PartitionFeed
from subscriptions.filters import SameScope
from subscriptions.session import Session

ACTOR = {"actor_id": "actor:agent:tester", "actor_kind": "agent"}


def catching_up_session(limit: int) -> Session:
    request = msgspec.convert({"scope_id": "workspace:buffer", "actor": ACTOR, "delivery": {"mode": "push"}},
                              SubscribeRequest)
    nc = types.SimpleNamespace(jetstream=lambda: None)  # offer() never reaches NATS while the session reads
    return Session("sub:buffer", request, 0, nc, "STREAM", "pam", 0, SameScope(),  # type: ignore[arg-type]
                   GatewaySettings(live_buffer_events=limit))


async def test_the_live_buffer_is_dropped_past_the_configured_limit() -> None:
    session = catching_up_session(limit=3)
    epoch = session.buffer_epoch
    for sequence in (1, 2, 3):
        await session.offer(sequence, {"n": sequence}, b"{}")
    assert [entry[0] for entry in session.buffer] == [1, 2, 3] and session.buffer_epoch == epoch
    await session.offer(4, {"n": 4}, b"{}")
    assert not session.buffer and session.buffer_epoch == epoch + 1 and not session.live


def test_the_feed_pauses_after_the_configured_time_without_a_push_subscription() -> None:
    nc = types.SimpleNamespace(jetstream=lambda: None)
    feed = PartitionFeed(nc, "STREAM", "pam", 0, lambda session, sequence: None,  # type: ignore[arg-type]
                         GatewaySettings(feed_pause_after_seconds=0.5))
    session = catching_up_session(limit=1)
    feed.add(session)
    feed.remove(session)
    assert not feed._unwanted()  # just left: not yet
    feed.last_wanted = time.monotonic() - 1.0
    assert feed._unwanted()  # 1 s without one: past 0.5 s (the default would wait 10 s)
    assert feed.idle_wait == 0.5  # and a caught-up fetch lingers no longer than that, so the pause is prompt
