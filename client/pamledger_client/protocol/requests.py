"""One NATS request with the binding's retries: the SDK and the service's own requesters share this loop."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Callable
from typing import Any

from nats.aio.client import Client as NATS
from nats.errors import NoRespondersError, TimeoutError as NatsTimeout

from pamledger_client.protocol.canonical import decode_json
from pamledger_client.protocol.errors import RETRYABLE


def unavailable_envelope(message: str) -> dict[str, Any]:
    """The `service_unavailable` envelope for a request nothing answered (its operation id minted here)."""
    return {"code": "service_unavailable", "message": message, "retryable": RETRYABLE["service_unavailable"],
            "operation_id": f"op:{uuid.uuid4()}", "details": {}}


async def request_with_retries(nc: NATS, subject: str, payload: bytes, headers: dict[str, str] | None,
                               timeout: float, retries: int,
                               decode: Callable[[bytes], dict[str, Any]] = decode_json) -> dict[str, Any]:
    """The decoded reply of a request: `{"result": ...}`, or `{"error": <envelope>}` once it is not
    `service_unavailable` or the retries are spent. No responder, a timeout and `service_unavailable` are
    retried (`retries` times, backoff 0.05 s doubling to 2 s); the SDK and services share this loop and
    each raises the envelope as its own error type. `decode` may leave the result undecoded (an error it
    decodes whole)."""
    delay = 0.05
    reply: dict[str, Any] = {}
    for attempt in range(retries + 1):
        try:
            msg = await nc.request(subject, payload, timeout=timeout, headers=headers or None)
        except (NoRespondersError, NatsTimeout) as exc:
            reply = {"error": unavailable_envelope(f"no answer from the service ({type(exc).__name__})")}
        else:
            reply = decode(msg.data)
            if "result" in reply or reply["error"]["code"] != "service_unavailable":
                return reply
        if attempt < retries:
            await asyncio.sleep(delay)
            delay = min(delay * 2, 2.0)
    return reply


def abandon_requests_in_flight(nc: NATS) -> int:
    """Fail every request still awaiting its reply as timed out; call it when the connection has just been
    re-established. Why: a reply sent toward a NATS node that died with the connection is lost, and a
    request waiting it out would stall its caller for the whole timeout (10 s by default) while a JetStream
    cluster fails over in about one. request_with_retries retries a timeout at once, with the same payload
    and idempotency key, as after any timeout. Returns how many it failed."""
    pending = [future for future in getattr(nc, "_resp_map", {}).values() if not future.done()]
    for future in pending:
        future.set_exception(NatsTimeout())
    return len(pending)
