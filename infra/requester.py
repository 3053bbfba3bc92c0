"""Writer commands over NATS for a service that writes ledger entries (the gateway's subscription entries).

Why not the SDK: services never import the SDK; this is the few lines of it a service needs, answering in
the server's own error type (schemas.errors.PamledgerError) so one error mapping turns it into a reply.
Retries as the SDK does: no responder, a timeout and `service_unavailable` are retried with backoff,
under one idempotency key per call so a retried command is written once.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Callable
from typing import Any, cast

import msgspec
from nats.aio.client import Client as NATS
from nats.errors import NoRespondersError, TimeoutError as NatsTimeout

from infra.subjects import command_subject
from schemas.auth import AUTHORIZATION_HEADER
from schemas.canonical import decode_json
from schemas.errors import AccessDenied, ErrorCode, PamledgerError, ServiceUnavailable
from schemas.replies import IDEMPOTENCY_HEADER, OPERATION_HEADER

_encoder = msgspec.json.Encoder()


class CommandRequester:
    """Sends writer commands by name and returns their `result`, or raises the error they answered."""

    def __init__(self, nc: NATS, prefix: str, timeout: float = 10.0, retries: int = 5, token: str | None = None):
        """`token`: the service credential its commands carry (authz.bootstrap), None where auth is off."""
        self.nc = nc
        self.prefix = prefix
        self.timeout = timeout
        self.retries = retries
        self.token = token

    async def command(self, name: str, body: dict[str, Any]) -> dict[str, Any]:
        headers = {OPERATION_HEADER: body.get("operation_id") or f"op:{uuid.uuid4()}"}
        if self.token is not None:
            headers[AUTHORIZATION_HEADER] = f"Bearer {self.token}"
        if not body.get("idempotency_key"):
            headers[IDEMPOTENCY_HEADER] = f"service:{uuid.uuid4()}"
        reply = await request_with_retries(self.nc, command_subject(self.prefix, name), _encoder.encode(body),
                                           headers, self.timeout, self.retries)
        if "result" in reply:
            return reply["result"]  # type: ignore[no-any-return]
        raise answered_error(reply["error"])


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
            unavailable = ServiceUnavailable(f"no answer from the service ({type(exc).__name__})")
            reply = {"error": msgspec.to_builtins(unavailable.envelope(f"op:{uuid.uuid4()}"))}
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


def answered_error(envelope: dict[str, Any]) -> PamledgerError:
    """The server-side error for a PAMSPEC error envelope another service answered (a refusal keeps its rule)."""
    if envelope.get("code") in ("access_denied", "policy_denied") and envelope.get("policy_rule_id"):
        return AccessDenied(str(envelope.get("message", "")), rule_id=str(envelope["policy_rule_id"]),
                            code=cast(ErrorCode, envelope["code"]))
    return PamledgerError(str(envelope.get("message", "")), details=envelope.get("details") or {},
                          code=cast(ErrorCode, envelope.get("code", "internal_error")))
