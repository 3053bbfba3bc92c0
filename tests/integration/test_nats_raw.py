"""infra.nats_raw: raw deliveries for one subscription, nats-py as usual for the rest of the connection."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator

import pytest
from nats.aio.msg import Msg
from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy, StreamConfig

from infra.nats_raw import RawClient, connect_raw, parse_headers, stream_sequence
from tests.conftest import Servers, wait_for


@pytest.fixture
async def nc(servers: Servers) -> AsyncIterator[RawClient]:
    client = await connect_raw(servers.nats_url, name="test-nats-raw")
    yield client
    await client.close()


async def test_a_raw_subscription_gets_bytes_and_the_others_get_messages(nc: RawClient) -> None:
    tag = uuid.uuid4().hex[:8]
    raw: list[tuple[bytes, bytes, bytes, bytes | None]] = []
    parsed: list[Msg] = []

    async def on_msg(msg: Msg) -> None:
        parsed.append(msg)

    sub = await nc.subscribe_raw(f"raw_{tag}.a", lambda *delivery: raw.append(delivery))
    await nc.subscribe(f"raw_{tag}.b", cb=on_msg)
    for subject in ("a", "b"):
        await nc.publish(f"raw_{tag}.{subject}", b"payload", reply="the.reply", headers={"Pam-Event-Type": "x"})
    await nc.publish(f"raw_{tag}.a", b"plain")
    await wait_for(lambda: len(raw) == 2 and len(parsed) == 1, timeout=10)
    subject = f"raw_{tag}.a".encode()
    assert raw[0] == (subject, b"the.reply", b"payload", b"NATS/1.0\r\nPam-Event-Type: x\r\n\r\n")
    assert raw[1] == (subject, b"", b"plain", None)
    assert parse_headers(raw[0][3]) == parsed[0].headers and parse_headers(raw[1][3]) is None
    assert parsed[0].data == b"payload" and parsed[0].headers == {"Pam-Event-Type": "x"}
    assert nc.stats["in_msgs"] == 3
    await nc.unsubscribe_raw(sub)
    await nc.publish(f"raw_{tag}.a", b"after")
    await nc.flush()
    assert len(raw) == 2


async def test_a_push_consumer_delivers_raw_events_with_their_stream_sequence(nc: RawClient) -> None:
    """The sequence read from the reply subject is the stream's, and '+ACK' published to it acknowledges."""
    tag = uuid.uuid4().hex[:8]
    stream, js = f"RAW_{tag.upper()}", nc.jetstream()
    await js.add_stream(StreamConfig(name=stream, subjects=[f"raw_{tag}.>"]))
    try:
        for i in range(5):
            await js.publish(f"raw_{tag}.e", f"event {i}".encode(), headers={"Nats-Msg-Id": f"{tag}-{i}"})
        got: list[tuple[bytes, bytes]] = []
        inbox = nc.new_inbox()
        await nc.subscribe_raw(inbox, lambda subject, reply, data, headers: got.append((reply, data)))
        await js.add_consumer(stream, ConsumerConfig(durable_name="raw", deliver_subject=inbox, ack_policy=AckPolicy.ALL,
                                                     deliver_policy=DeliverPolicy.BY_START_SEQUENCE, opt_start_seq=2))
        await wait_for(lambda: len(got) == 4, timeout=10)
        assert [stream_sequence(reply) for reply, _ in got] == [2, 3, 4, 5]
        assert [Msg.Metadata._from_reply(reply.decode()).sequence.stream for reply, _ in got] == [2, 3, 4, 5]
        assert [data for _, data in got] == [f"event {i}".encode() for i in range(1, 5)]
        await nc.publish(got[2][0].decode(), b"+ACK")

        async def acked() -> bool:
            return (await js.consumer_info(stream, "raw")).ack_floor.stream_seq == 4

        await wait_for(acked, timeout=10)
    finally:
        await js.delete_stream(stream)


def test_stream_sequence_reads_both_reply_layouts_and_refuses_others() -> None:
    assert stream_sequence(b"$JS.ACK.S.c.1.42.7.1700000000000000000.0") == 42
    assert stream_sequence(b"$JS.ACK.dom.hash.S.c.1.43.7.1700000000000000000.0") == 43
    assert stream_sequence(b"$JS.ACK.dom.hash.S.c.1.44.7.1700000000000000000.0.rand") == 44
    for bad in (b"", b"_INBOX.abc", b"$JS.ACK.S.c.1.42", b"$JS.ACK.a.b.c.d.e.f.g.h", b"$JS.NAK.S.c.1.42.7.1.0"):
        with pytest.raises(ValueError):
            stream_sequence(bad)


def test_the_nats_py_hook_is_where_raw_client_expects_it() -> None:
    """RawClient overrides nats-py's internal per-delivery hook; a nats-py that renames it must fail here."""
    import inspect

    from nats.aio.client import Client
    from nats.protocol.parser import Parser

    assert list(inspect.signature(Client._process_msg).parameters) == ["self", "sid", "subject", "reply", "data",
                                                                        "headers"]
    assert "self.nc._process_msg(sid, subject, reply, payload, hdr)" in inspect.getsource(Parser.parse)
    assert asyncio.iscoroutinefunction(RawClient._process_msg)


async def test_a_queue_group_raw_subscription_shares_deliveries(nc: RawClient, servers: Servers) -> None:
    tag = uuid.uuid4().hex[:8]
    other = await connect_raw(servers.nats_url, name="test-nats-raw-2")
    try:
        got: list[bytes] = []
        for client in (nc, other):
            await client.subscribe_raw(f"rawq_{tag}", lambda s, r, data, h: got.append(data), queue="q")
        await other.flush()
        for i in range(20):
            await nc.publish(f"rawq_{tag}", str(i).encode())
        await wait_for(lambda: len(got) == 20, timeout=10)
        assert sorted(got, key=int) == [str(i).encode() for i in range(20)]  # each once, across the group
    finally:
        await other.close()


def test_parse_headers_matches_nats_py_for_several_headers() -> None:
    block = b"NATS/1.0\r\nPam-Operation-Id: op:1\r\nIdempotency-Key: k:\xc3\xa9\r\n\r\n"
    assert parse_headers(block) == {"Pam-Operation-Id": "op:1", "Idempotency-Key": "k:\u00e9"}
    assert parse_headers(b"NATS/1.0\r\n\r\n") is None and parse_headers(None) is None
