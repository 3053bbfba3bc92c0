"""The fan-out benchmark's subscribers: raw nats-py clients of the Subscribe protocol, many per connection.

ONE wildcard subscription on `{prefix}.sub.deliver.*`, made before the first open so nothing pushed is
missed, dispatches each push to its subscriber by the subject's token (the body is decoded into a small
struct that skips the event). Each subscriber follows docs/protocol.md as the SDK does: it ignores
messages of an older generation and duplicates, and when a push names a `previous_sequence` beyond the
last event it processed (a lost message), or a keepalive a `last_delivered_sequence` beyond it, it calls
`resume` with its last sequence; it acks cumulatively with a plain publish to `{prefix}.sub.ack` every
50 ms when it has processed something new. Receive times (monotonic) are kept per event.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field

import msgspec
import nats
from nats.aio.client import Client as NATS
from nats.aio.msg import Msg

from bench.load import REQUEST_TIMEOUT

ACK_INTERVAL = 0.05


class Push(msgspec.Struct):
    """What the bench reads of a pushed message (the event itself is skipped, not decoded)."""

    type: str
    ledger_sequence: int = 0
    previous_sequence: int = 0
    last_delivered_sequence: int = 0
    generation: int = 0
    reason: str = ""


_decode_push = msgspec.json.Decoder(Push).decode


@dataclass
class Subscriber:
    """One subscription as the bench sees it; `last` is the last event processed, in order."""

    scope: int
    subscription_id: str
    start: int
    generation: int
    times: dict[int, float] = field(default_factory=dict)
    last: int = 0
    acked: int = 0
    gaps: int = 0
    duplicates: int = 0
    resumes: int = 0
    resuming: bool = False
    closed: str = ""


class Fleet:
    """All subscribers behind one wildcard subscription, plus their background acker."""

    def __init__(self, nc: NATS, prefix: str):
        self.nc = nc
        self.prefix = prefix
        self.by_token: dict[str, Subscriber] = {}
        self.early: dict[str, list[tuple[Push, float]]] = {}
        self.keepalives = 0
        self.resume_failures = 0
        self._tasks: set[asyncio.Task[None]] = set()

    async def start(self) -> None:
        self.sub = await self.nc.subscribe(f"{self.prefix}.sub.deliver.*", cb=self._on_msg,
                                           pending_msgs_limit=4_000_000, pending_bytes_limit=2 << 30)
        self.acker = asyncio.create_task(self._ack_forever())

    async def _on_msg(self, msg: Msg) -> None:
        now = time.monotonic()
        token = msg.subject.rsplit(".", 1)[-1]
        push = _decode_push(msg.data)
        found = self.by_token.get(token)
        if found is None:
            self.early.setdefault(token, []).append((push, now))  # pushed before its open reply arrived
        else:
            self._accept(found, push, now)

    def _accept(self, s: Subscriber, push: Push, now: float) -> None:
        if push.generation < s.generation:
            return
        if push.type == "event":
            if push.ledger_sequence <= s.last:
                s.duplicates += 1
            elif push.previous_sequence > s.last:
                s.gaps += 1
                self._resume(s)
            else:
                s.times[push.ledger_sequence] = now
                s.last = push.ledger_sequence
        elif push.type == "keepalive":
            self.keepalives += 1
            if push.last_delivered_sequence > s.last:
                self._resume(s)
        elif push.type == "closed":
            s.closed = push.reason or "closed"

    def _resume(self, s: Subscriber) -> None:
        if s.resuming or s.closed:
            return
        s.resuming = True
        task = asyncio.create_task(self._resume_one(s))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _resume_one(self, s: Subscriber) -> None:
        body = msgspec.json.encode({"subscription_id": s.subscription_id, "after_sequence": s.last})
        try:
            msg = await self.nc.request(f"{self.prefix}.sub.resume", body, timeout=REQUEST_TIMEOUT)
            reply = msgspec.json.decode(msg.data)
            if "result" in reply:
                s.generation = int(reply["result"]["generation"])
                s.resumes += 1
            else:
                self.resume_failures += 1
        except nats.errors.Error:
            self.resume_failures += 1
        finally:
            s.resuming = False

    def register(self, token: str, s: Subscriber) -> None:
        s.last = s.acked = s.start
        self.by_token[token] = s
        for push, at in self.early.pop(token, []):
            self._accept(s, push, at)

    async def _ack_forever(self) -> None:
        subject = f"{self.prefix}.sub.ack"
        while True:
            await asyncio.sleep(ACK_INTERVAL)
            for s in list(self.by_token.values()):
                if s.last > s.acked:
                    await self.nc.publish(subject, msgspec.json.encode(
                        {"subscription_id": s.subscription_id, "ledger_sequence": s.last}))
                    s.acked = s.last

    async def stop(self) -> None:
        for task in (self.acker, *self._tasks):
            task.cancel()
        await asyncio.gather(self.acker, *self._tasks, return_exceptions=True)
        await self.sub.unsubscribe()
