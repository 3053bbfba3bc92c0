"""Writer commands over NATS for a service that writes ledger entries (the gateway's subscription entries).

Why not the SDK: services never import the SDK; this is the few lines of it a service needs, answering in
the server's own error type (schemas.errors.PamledgerError) so one error mapping turns it into a reply.
Retries as the SDK does: no responder, a timeout and `service_unavailable` are retried with backoff,
under one idempotency key per call so a retried command is written once.
"""

from __future__ import annotations

import uuid
from typing import Any, cast

import msgspec
from nats.aio.client import Client as NATS

from infra import tracing
from pamledger_client.protocol.subjects import command_subject
from schemas.auth import AUTHORIZATION_HEADER
from schemas.errors import AccessDenied, ErrorCode, PamledgerError
from schemas.replies import IDEMPOTENCY_HEADER, OPERATION_HEADER
from pamledger_client.protocol.requests import request_with_retries  # the SDK's loop too

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
        if tracing.ENABLED:  # a service's own command (an indexer's record, a retention move) is a trace of its own
            with tracing.span("service.command", None, {"pamledger.command": name}) as span:
                headers.update(tracing.traceparent(span))
                reply = await self._send(name, body, headers)
        else:
            reply = await self._send(name, body, headers)
        if "result" in reply:
            return reply["result"]  # type: ignore[no-any-return]
        raise answered_error(reply["error"])

    async def _send(self, name: str, body: dict[str, Any], headers: dict[str, str]) -> dict[str, Any]:
        return await request_with_retries(self.nc, command_subject(self.prefix, name), _encoder.encode(body),
                                          headers, self.timeout, self.retries)


def answered_error(envelope: dict[str, Any]) -> PamledgerError:
    """The server-side error for a PAMSPEC error envelope another service answered (a refusal keeps its rule)."""
    if envelope.get("code") in ("access_denied", "policy_denied") and envelope.get("policy_rule_id"):
        return AccessDenied(str(envelope.get("message", "")), rule_id=str(envelope["policy_rule_id"]),
                            code=cast(ErrorCode, envelope["code"]))
    return PamledgerError(str(envelope.get("message", "")), details=envelope.get("details") or {},
                          code=cast(ErrorCode, envelope.get("code", "internal_error")))
