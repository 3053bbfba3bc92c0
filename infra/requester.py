"""Writer commands over NATS for a service that writes ledger entries (the gateway's subscription entries).

Why not the SDK: services never import the SDK; this is the few lines of it a service needs, answering in
the server's own error type (schemas.errors.PamledgerError) so one error mapping turns it into a reply.
Retries as the SDK does: no responder, a timeout and `service_unavailable` are retried with backoff,
under one idempotency key per call so a retried command is written once.
"""

from __future__ import annotations

import asyncio
import uuid
from typing import Any, cast

import msgspec
from nats.aio.client import Client as NATS
from nats.errors import NoRespondersError, TimeoutError as NatsTimeout

from infra.subjects import command_subject
from schemas.canonical import decode_json
from schemas.errors import ErrorCode, PamledgerError, ServiceUnavailable
from schemas.replies import IDEMPOTENCY_HEADER, OPERATION_HEADER

_encoder = msgspec.json.Encoder()


class CommandRequester:
    """Sends writer commands by name and returns their `result`, or raises the error they answered."""

    def __init__(self, nc: NATS, prefix: str, timeout: float = 10.0, retries: int = 5):
        self.nc = nc
        self.prefix = prefix
        self.timeout = timeout
        self.retries = retries

    async def command(self, name: str, body: dict[str, Any]) -> dict[str, Any]:
        headers = {OPERATION_HEADER: body.get("operation_id") or f"op:{uuid.uuid4()}"}
        if not body.get("idempotency_key"):
            headers[IDEMPOTENCY_HEADER] = f"service:{uuid.uuid4()}"
        payload, delay = _encoder.encode(body), 0.05
        error: PamledgerError = ServiceUnavailable("no attempt made")
        for attempt in range(self.retries + 1):
            try:
                msg = await self.nc.request(command_subject(self.prefix, name), payload, timeout=self.timeout,
                                            headers=headers)
            except (NoRespondersError, NatsTimeout) as exc:
                error = ServiceUnavailable(f"no answer from the writer ({type(exc).__name__})")
            else:
                reply = decode_json(msg.data)
                if "result" in reply:
                    return reply["result"]  # type: ignore[no-any-return]
                error = answered_error(reply["error"])
                if error.code != "service_unavailable":
                    raise error
            if attempt < self.retries:
                await asyncio.sleep(delay)
                delay = min(delay * 2, 2.0)
        raise error


def answered_error(envelope: dict[str, Any]) -> PamledgerError:
    """The server-side error for a PAMSPEC error envelope another service answered."""
    return PamledgerError(str(envelope.get("message", "")), details=envelope.get("details") or {},
                          code=cast(ErrorCode, envelope.get("code", "internal_error")))
