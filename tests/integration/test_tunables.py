"""Tunables reach the roles that use them: a service run with non-default settings shows each where it acts
(the projector's consumer, the query service's limits, a subscription reader's expiry).

Why: these were module constants that tests monkeypatched; a setting that is parsed but never passed down
would look configurable and change nothing."""

from __future__ import annotations

from typing import Any

import msgspec
import pytest
from nats.js.errors import NotFoundError

from pamledger_client.protocol.subjects import query_subject
from pamledger_client.client import MemoryClient
from tests.conftest import ACTOR, PROVENANCE, Env, Servers, fresh_database, fresh_settings, wait_for

SCOPE = "workspace:tunables"


@pytest.fixture(scope="module")
def env(servers: Servers) -> Env:
    settings = fresh_settings("tunables", query={"max_request_bytes": 1024}, follower={"max_ack_pending": 100},
                              gateway={"reader_idle_seconds": 7})
    return Env(servers, fresh_database(servers, "tunables"), settings)


@pytest.fixture(scope="module", autouse=True)
async def scope(client: MemoryClient) -> None:
    await client.create_scope(SCOPE)


async def test_the_projector_consumer_lets_the_configured_number_of_events_go_unacknowledged(
        client: MemoryClient, service: Env) -> None:
    created = await client.create(SCOPE, "claim", {"n": 1}, ACTOR, PROVENANCE)
    await client.query(SCOPE, min_sequence=created["ledger_sequence"], wait_ms=10_000)
    js = client.nc.jetstream()

    async def consumer() -> Any:
        try:
            return await js.consumer_info(service.settings.stream_name, "pamledger-projector-p0")
        except NotFoundError:
            return None

    info = await wait_for(consumer, timeout=30)
    assert info.config.max_ack_pending == 100


async def test_a_query_request_past_the_configured_size_is_invalid_request(client: MemoryClient) -> None:
    subject = query_subject(client.prefix, "query")
    small = msgspec.json.encode({"scope_id": SCOPE, "operation_id": "op:" + "x" * 400})
    big = msgspec.json.encode({"scope_id": SCOPE, "text": "x" * 500, "operation_id": "op:" + "x" * 500})
    assert len(small) < 1024 < len(big) < 65_536  # refused only under the configured limit, not the default
    answered = msgspec.json.decode((await client.nc.request(subject, small, timeout=10)).data)
    assert "result" in answered, answered
    refused = msgspec.json.decode((await client.nc.request(subject, big, timeout=10)).data)
    assert refused["error"]["code"] == "invalid_request"
    assert refused["error"]["details"] == {"limit_bytes": 1024}


async def test_a_subscription_reader_expires_after_the_configured_idle_time(client: MemoryClient,
                                                                           service: Env) -> None:
    opened = await client.subscription_request("open", {"scope_id": SCOPE, "actor": ACTOR, "after_sequence": 0,
                                                        "delivery": {"mode": "poll"}})
    await client.subscription_request("poll", {"subscription_id": opened["subscription_id"], "wait_ms": 100})
    js = client.nc.jetstream()
    readers = [c for c in await js.consumers_info(service.settings.stream_name) if c.name.startswith("pamsub_")]
    assert readers and all(c.config.inactive_threshold == 7 for c in readers), readers
    await client.subscription_request("close", {"subscription_id": opened["subscription_id"]})
