"""Streamable HTTP at `/mcp`: every request proves its own bearer token before the SDK sees it.

The gate answers 401 (no token, a malformed one, one the service does not authenticate) or 503 (the service
cannot say now) with the PAMSPEC error envelope as the body, before any tool runs. A session belongs to the
token that opened it: a request naming another token's session id is answered as for an unknown session
(404), so a leaked session id gives nothing (not even the doorbells of the session's owner).
"""

from __future__ import annotations

import json
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from typing import Any

from mcp.server.transport_security import TransportSecuritySettings
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from authz.tokens import token_id_or_none
from mcp_binding.callers import Caller, CallerPool
from pamledger_client.errors import PamspecError

SESSION_HEADER = b"mcp-session-id"
LOOPBACK_HOSTS = ("127.0.0.1:*", "localhost:*", "[::1]:*")
MAX_SESSIONS_REMEMBERED = 10_000
SessionEnd = Callable[[str], Awaitable[None]]


def bearer_of(headers: Any) -> str | None:
    """The token of an `Authorization: Bearer <token>` header value, or None."""
    value = headers.get("authorization") if headers is not None else None
    if not isinstance(value, str):
        return None
    scheme, _, token = value.strip().partition(" ")
    return token.strip() or None if scheme.lower() == "bearer" else None


def transport_security(host: str, allowed: list[str]) -> TransportSecuritySettings:
    """DNS-rebinding protection on for every bind: Host must be loopback, the bound host, or one allowed."""
    hosts = list(dict.fromkeys([*LOOPBACK_HOSTS, f"{host}:*", *allowed]))
    origins = [f"http://{h}" for h in hosts] + [f"https://{h}" for h in hosts]
    return TransportSecuritySettings(enable_dns_rebinding_protection=True, allowed_hosts=hosts,
                                     allowed_origins=origins)


class BearerGate:
    """ASGI middleware in front of the SDK's app: authenticate, bind sessions to their token, pass through."""

    def __init__(self, app: ASGIApp, pool: CallerPool, on_session_end: SessionEnd):
        self.app = app
        self.pool = pool
        self.on_session_end = on_session_end  # what a session leaves behind (its doorbells) is ended here
        self._owners: OrderedDict[str, str] = OrderedDict()  # session id -> token id of the token that opened it

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)  # lifespan
            return
        headers, repeated = _headers(scope)
        if repeated:  # the SDK reads the first of a repeated header: one value each, or the gate is bypassed
            await _refuse(send, 400, PamspecError.of("invalid_request", f"header {repeated} given more than once",
                                                     {"field": f"headers/{repeated}"}))
            return
        token = bearer_of(headers)
        token_id = token_id_or_none(token)
        if token is None or token_id is None:
            await _refuse(send, 401, PamspecError.of(
                "access_denied", "send `Authorization: Bearer pam_...` (a pamledger token) with every request",
                policy_rule_id="auth.missing_credential" if token is None else "auth.malformed_credential"))
            return
        try:
            await self.pool.authenticate(token)
        except PamspecError as exc:
            await _refuse(send, 503 if exc.retryable else 401, exc)
            return
        session = headers.get(SESSION_HEADER.decode())
        if session is not None and self._owners.get(session, token_id) != token_id:
            await _refuse(send, 404, PamspecError.of("invalid_request", "no such session", {"field": "mcp-session-id"}))
            return
        await self.app(scope, receive, self._binding(send, token_id) if session is None else send)
        if scope.get("method") == "DELETE" and session is not None:  # the client ended its session
            self._owners.pop(session, None)
            await self.on_session_end(session)

    def _binding(self, send: Send, token_id: str) -> Send:
        """`send`, remembering the session id a response hands out as belonging to `token_id`."""
        async def bind(message: Message) -> None:
            if message["type"] == "http.response.start":
                for key, value in message.get("headers", []):
                    if key.lower() == SESSION_HEADER:
                        self._owners[value.decode("latin-1")] = token_id
                        while len(self._owners) > MAX_SESSIONS_REMEMBERED:
                            self._owners.popitem(last=False)
            await send(message)
        return bind


GATED_HEADERS = ("authorization", SESSION_HEADER.decode())


def _headers(scope: Scope) -> tuple[dict[str, str], str | None]:
    """The request's headers (names lower case) and the first gated header that appears more than once."""
    headers: dict[str, str] = {}
    repeated = None
    for key, value in scope.get("headers", []):
        name = key.decode("latin-1").lower()
        if name in headers and name in GATED_HEADERS and repeated is None:
            repeated = name
        headers.setdefault(name, value.decode("latin-1"))
    return headers, repeated


async def _refuse(send: Send, status: int, error: PamspecError) -> None:
    body = json.dumps({"error": error.envelope()}, sort_keys=True).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    if status == 401:
        headers.append((b"www-authenticate", b'Bearer realm="pamledger", error="invalid_token"'))
    if status == 503:
        headers.append((b"retry-after", b"1"))
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


def resolver(pool: CallerPool) -> Any:
    """The request's caller: the token of the HTTP request that carried it (the gate has proved it)."""
    async def resolve(ctx: Any) -> Caller:
        token = bearer_of(getattr(ctx.request, "headers", None))
        if token is None:
            raise PamspecError.of("access_denied", "this request carries no bearer token",
                                  policy_rule_id="auth.missing_credential")
        return await pool.authenticate(token)
    return resolve
