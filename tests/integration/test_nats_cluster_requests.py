"""A request lost with the client's NATS node is retried as soon as the client reconnects to another.

Why: a request still in the node when it dies (or its reply, on the way back) is lost; the client used to
wait out its whole request timeout (10 s by default) before retrying, while the rest of a cluster goes on
within a second. A real 3-node cluster, a responder on one node, the client given only another node's URL
(it learns the others from the cluster); that node is frozen, the request sent into it, the node SIGKILLed.
"""

from __future__ import annotations

import asyncio
import os
import signal
import time
from collections.abc import Iterator

import nats
import pytest
from nats.aio.client import Client as NATS
from nats.aio.msg import Msg

from infra.requester import request_with_retries
from local_servers.launch import free_port
from local_servers.nats_cluster import start_cluster
from local_servers.nats_server import NatsServer
from pamledger_client.connection import open_nats
from pamledger.runtime import connect_nats
from tests.conftest import wait_for

TIMEOUT_SECONDS = 10.0  # the SDK's default request timeout (settings.request_timeout_seconds)
ANSWER_AFTER_SECONDS = 1.0


@pytest.fixture
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[NatsServer]]:
    nodes = start_cluster(tmp_path_factory.mktemp("requests-cluster"), 3, free_port)
    yield nodes
    for node in nodes:
        node.stop()


async def slow_responder(url: str) -> NATS:
    """Answers `slow.echo` after ANSWER_AFTER_SECONDS: long enough for the requester's node to die first."""
    nc = await nats.connect(url)

    async def answer(msg: Msg) -> None:
        await asyncio.sleep(ANSWER_AFTER_SECONDS)
        await msg.respond(b'{"result": {"ok": true}}')

    await nc.subscribe("slow.echo", cb=answer)
    await nc.flush()
    return nc


async def routed(client: NATS) -> bool:
    """The responder's subscription reached the client's node (a request there finds it)."""
    try:
        await client.request("slow.echo", b"", timeout=ANSWER_AFTER_SECONDS + 2)
    except nats.errors.NoRespondersError:
        return False
    return True


@pytest.mark.parametrize("connect", ["sdk", "service"])
async def test_a_request_whose_reply_died_with_the_node_is_retried_at_the_reconnect(
        cluster: list[NatsServer], connect: str) -> None:
    doomed, other, _ = cluster
    responder = await slow_responder(other.url)
    client = await (open_nats(doomed.url, 2.0) if connect == "sdk" else connect_nats(doomed.url, "test-requests"))
    await wait_for(lambda: routed(client), timeout=30)
    await wait_for(lambda: len(client.servers) >= 3, timeout=10)  # it knows the other nodes (cluster gossip)
    os.kill(doomed.pid, signal.SIGSTOP)  # what it receives now is never routed on
    started = time.monotonic()
    request = asyncio.create_task(request_with_retries(client, "slow.echo", b"", None, TIMEOUT_SECONDS, 3))
    await asyncio.sleep(0.2)
    doomed.kill()
    reply = await asyncio.wait_for(request, timeout=3 * TIMEOUT_SECONDS)
    took = time.monotonic() - started
    assert reply == {"result": {"ok": True}}
    # The retry after the reconnect is answered ANSWER_AFTER_SECONDS later; waiting out the lost request takes
    # TIMEOUT_SECONDS. Half of it tells the two apart with room for a slow reconnect.
    assert took < TIMEOUT_SECONDS / 2, f"answered after {took:.1f}s: the lost request was waited out"
    await client.close()
    await responder.close()
