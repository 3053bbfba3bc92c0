"""A nats-py client that can hand a subscription's deliveries to a plain function, as bytes.

For every delivery nats-py parses the header block into a dict, builds a `Msg` and queues it for the
subscription's own task, which then calls the callback; a JetStream consumer parses the reply subject
again for the stream sequence (`msg.metadata`). The projector reads every ledger event and needs none of
that: a py-spy profile at 5,000 events/s put 40% of its CPU there (header parsing alone 25%). The writer
takes every command. `RawClient.subscribe_raw` registers a synchronous `handler(subject, reply, data,
headers)` that the client's read loop calls directly with the raw bytes: no `Msg`, no task hop, and the
header block parsed only if the handler asks (`parse_headers`).

It hooks nats-py's internal `Client._process_msg(sid, subject, reply, data, headers)`, which its protocol
parser awaits for every MSG/HMSG (nats-py 2.x); `tests/integration/test_nats_raw.py` fails if that hook
moves.
Every other subscription on the connection is untouched.
"""

from __future__ import annotations

from collections.abc import Callable

from nats.aio.client import Client
from nats.aio.subscription import Subscription

from infra.nats_servers import server_urls

RawHandler = Callable[[bytes, bytes, bytes, bytes | None], None]  # (subject, reply, payload, header block)


class RawClient(Client):
    """nats-py's Client plus `subscribe_raw`; every other call behaves as nats-py's."""

    def __init__(self) -> None:
        super().__init__()
        self._raw_handlers: dict[int, RawHandler] = {}

    async def subscribe_raw(self, subject: str, handler: RawHandler, queue: str = "") -> Subscription:
        """Subscribe `subject` (in queue group `queue`, if given) with `handler` called in the read loop for
        each delivery; it must not block. Nothing is queued on the client, so there is no pending limit:
        the handler keeps what it needs."""
        sub = await self.subscribe(subject, queue=queue)
        self._raw_handlers[sub._id] = handler
        return sub

    async def unsubscribe_raw(self, sub: Subscription) -> None:
        self._raw_handlers.pop(sub._id, None)
        await sub.unsubscribe()

    async def _process_msg(self, sid: int, subject: bytes, reply: bytes, data: bytes,
                           headers: bytes) -> None:
        handler = self._raw_handlers.get(sid)
        if handler is None:
            await super()._process_msg(sid, subject, reply, data, headers)
            return
        self.stats["in_msgs"] += 1
        self.stats["in_bytes"] += len(data)
        handler(subject, reply, data, headers)


async def connect_raw(url: str, **options: object) -> RawClient:
    """`nats.connect` with a RawClient; `url` may name a cluster's nodes, comma-separated."""
    nc = RawClient()
    await nc.connect(server_urls(url), **options)  # type: ignore[arg-type]
    return nc


def parse_headers(block: bytes | None) -> dict[str, str] | None:
    """A delivery's header block as the dict nats-py would give (`msg.headers`), its status line aside:
    None when there is none. Uses nats-py's own line parser."""
    if not block:
        return None
    _version, _, lines = block.partition(b"\r\n")
    return Client._parse_header_lines(lines) or None


def stream_sequence(reply: bytes) -> int:
    """The stream sequence named by a JetStream delivery's reply (ack) subject, in either layout:
    `$JS.ACK.<stream>.<consumer>.<delivered>.<sseq>.<cseq>.<tm>.<pending>` or, with a domain,
    `$JS.ACK.<domain>.<account hash>.<stream>.<consumer>.<delivered>.<sseq>.<cseq>.<tm>.<pending>[.<token>]`."""
    tokens = reply.split(b".")
    if tokens[:2] != [b"$JS", b"ACK"] or len(tokens) not in (9, 11, 12):
        raise ValueError(f"not a JetStream reply subject: {reply[:120]!r}")
    return int(tokens[5] if len(tokens) == 9 else tokens[7])
