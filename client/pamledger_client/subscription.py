"""`async for event in client.subscribe(...)`: at-least-once delivery made exactly-once-in-order for you.

The iterator deduplicates by ledger sequence (events arrive in ledger order), acknowledges what you
processed (cumulatively, in the background), notices a lost message by its `previous_sequence` and
re-attaches from the last event you processed, and re-attaches too when the gateway goes quiet (a
fail-over) — so after any crash you see every matching event once, in order.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any

import msgspec

from pamledger_client.protocol.subjects import subscription_subject

if TYPE_CHECKING:
    from pamledger_client.client import MemoryClient

_decoder = msgspec.json.Decoder(dict[str, Any])


class Subscription:
    """An open subscription; iterate it for events. `closed` holds the terminal close notice, if any."""

    def __init__(self, client: MemoryClient, opened: dict[str, Any], keepalive_ms: int,
                 actor: dict[str, Any] | None = None):
        self.client = client
        self.actor = actor  # named (Pam-Actor) on its resume, ack and close requests as on its open
        self.subscription_id: str = opened["subscription_id"]
        self.delivery_subject: str = opened["delivery_subject"]
        self.last_sequence: int = int(opened.get("start_sequence", opened.get("resumed_after", 0)))
        self.generation: int = int(opened.get("generation", 0))
        self.closed: dict[str, Any] | None = None
        self.quiet_seconds = max(3 * keepalive_ms / 1000, 5.0)
        self._to_ack = 0
        self._acked = 0

    async def listen(self) -> None:
        """Start receiving at once (called by MemoryClient.subscribe), so nothing waits for iteration."""
        queue: asyncio.Queue[Any] = asyncio.Queue()
        self.adopt(queue, await self.client.nc.subscribe(self.delivery_subject, cb=queue.put))

    def adopt(self, queue: asyncio.Queue[Any], sub: Any) -> None:
        """Receive from a NATS subscription made before the open (on the inbox the open named)."""
        self._queue = queue
        self._sub = sub

    async def __aiter__(self) -> AsyncIterator[dict[str, Any]]:
        queue = self._queue
        acker = asyncio.create_task(self._ack_forever())
        try:
            while self.closed is None:
                try:  # asyncio.timeout, not wait_for: on 3.11 wait_for can swallow a cancellation
                    async with asyncio.timeout(self.quiet_seconds):
                        msg = await queue.get()
                except TimeoutError:
                    await self.resume()  # the gateway went quiet: re-attach from what we processed
                    continue
                event = await self._accept(_decoder.decode(msg.data))
                if event is not None:
                    yield event
                    self.last_sequence = self._to_ack = event["ledger_sequence"]
        finally:
            acker.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await acker
            await self._send_ack()

    async def _accept(self, body: dict[str, Any]) -> dict[str, Any] | None:
        """The event to hand out, or None (stale, duplicate, keepalive, or a gap that made us resume)."""
        if body.get("generation", self.generation) < self.generation:
            if body["type"] == "keepalive":
                # A gateway that took over counts generations from 1 again: everything it pushes looks stale
                # and never goes quiet, so re-attach now (the resume answers its current generation).
                await self.resume()
            return None
        if body["type"] == "closed":
            self.closed = body
            return None
        if body["type"] == "keepalive":
            if body["last_delivered_sequence"] > self.last_sequence:
                await self.resume()  # something pushed never reached us
            return None
        if body["type"] != "event":
            return None
        sequence = body["ledger_sequence"]
        if sequence <= self.last_sequence:
            self._to_ack = max(self._to_ack, sequence)
            return None
        if body["previous_sequence"] > self.last_sequence:
            await self.resume()
            return None
        return {"ledger_sequence": sequence, "event": body["event"]}

    async def resume(self) -> None:
        body: dict[str, Any] = {"subscription_id": self.subscription_id, "after_sequence": self.last_sequence}
        if self.delivery_subject.startswith("_INBOX."):  # ours: pushes keep coming here, whichever token resumes
            body["delivery_subject"] = self.delivery_subject
        reply = await self.client.subscription_request("resume", body, self.actor)
        self.generation = int(reply["generation"])

    async def _ack_forever(self) -> None:
        while True:
            await asyncio.sleep(0.05)
            await self._send_ack()

    async def _send_ack(self) -> None:
        if self._to_ack > self._acked:
            body = msgspec.json.encode({"subscription_id": self.subscription_id, "ledger_sequence": self._to_ack})
            await self.client.nc.publish(subscription_subject(self.client.prefix, "ack"), body,
                                         headers=self.client.request_headers(self.client.actor_header(self.actor)) or None)
            self._acked = self._to_ack

    async def close(self, reason: str = "unsubscribed") -> dict[str, Any]:
        """Unsubscribe: the gateway stops delivery and records subscription_closed."""
        closed = await self.client.subscription_request("close", {"subscription_id": self.subscription_id,
                                                                  "reason": reason}, self.actor)
        await self._sub.unsubscribe()
        return closed
