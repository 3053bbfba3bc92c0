"""The request shell: the actor header becomes the context, the policy decides before the handler, one error
mapping answers every failure.

Why: reads, queries and subscription requests used to answer from three catch ladders and named no caller;
[M6] plugs authorization in at the policy port, so a Deny must answer before any handler runs.
"""

from __future__ import annotations

from typing import Any

import msgspec
import nats.errors
import psycopg
import pytest

from infra.request_shell import (
    ANONYMOUS, Allow, AllowAll, Decision, Deny, Principal, RequestContext, RequestShell, to_error,
)
from schemas.errors import ObjectNotFound

ACTOR = {"actor_id": "agent:alice", "actor_kind": "agent"}


class Body(msgspec.Struct):
    scope_id: str
    operation_id: str | None = None


class Recorder(AllowAll):
    """A policy that denies agent:mallory and records what it was asked."""

    def __init__(self) -> None:
        self.asked: list[tuple[str, RequestContext]] = []

    def decide(self, context: RequestContext, operation: str) -> Decision:
        self.asked.append((operation, context))
        if context.principal.actor_id == "agent:mallory":
            return Deny("rule:test:no-mallory")
        return Allow()


async def run(headers: dict[str, str] | None, policy: Any = None, data: bytes = b'{"scope_id":"workspace:s"}',
              handler: Any = None) -> tuple[dict[str, Any], list[RequestContext]]:
    seen: list[RequestContext] = []

    async def handle(request: Body, context: RequestContext) -> bytes:
        seen.append(context)
        if handler is not None:
            await handler()
        return b'{"result":{}}'

    shell = RequestShell(policy)
    body = await shell.answer("query.read", "pam.q.read", data, headers, msgspec.json.Decoder(Body).decode, handle)
    return msgspec.json.decode(body), seen


def header(value: Any) -> dict[str, str]:
    return {"Pam-Actor": value if isinstance(value, str) else msgspec.json.encode(value).decode()}


async def test_the_actor_header_reaches_the_handler_context() -> None:
    reply, seen = await run({**header(ACTOR), "Pam-Operation-Id": "op:1"})
    assert reply == {"result": {}}
    assert seen[0].principal == Principal(**ACTOR)
    assert (seen[0].operation_id, seen[0].scope_id, seen[0].subject) == ("op:1", "workspace:s", "pam.q.read")


async def test_no_actor_header_is_the_anonymous_principal() -> None:
    _, seen = await run(None)
    assert seen[0].principal == ANONYMOUS and seen[0].anonymous


async def test_a_deny_answers_access_denied_without_reaching_the_handler() -> None:
    policy = Recorder()
    reply, seen = await run(header({"actor_id": "agent:mallory", "actor_kind": "agent"}), policy)
    assert seen == []
    assert reply["error"]["code"] == "access_denied"
    assert reply["error"]["policy_rule_id"] == "rule:test:no-mallory"
    assert policy.asked[0][0] == "query.read"


@pytest.mark.parametrize("value", [
    "not json", "{}", '{"actor_id": "agent:a"}', '{"actor_id": "no-scheme", "actor_kind": "agent"}',
    '{"actor_id": "agent:a", "actor_kind": "agent", "extra": 1}', '{"actor_id": "agent:a", "actor_kind": ""}',
    '{"actor_id": "agent:a", "actor_kind": "a\\u0000b"}', "x" * 5000,
])
async def test_a_malformed_actor_header_is_invalid_request_before_the_policy(value: str) -> None:
    policy = Recorder()
    reply, seen = await run(header(value), policy)
    assert reply["error"]["code"] == "invalid_request"
    assert reply["error"]["details"]["field"].startswith("headers/Pam-Actor")
    assert seen == [] and policy.asked == []


async def test_a_malformed_body_is_invalid_request() -> None:
    reply, seen = await run(None, data=b"{")
    assert reply["error"]["code"] == "invalid_request" and seen == []


async def test_the_request_operation_id_is_echoed_on_failure() -> None:
    async def missing() -> None:
        raise ObjectNotFound("no such object")

    reply, _ = await run(None, data=b'{"scope_id":"workspace:s","operation_id":"op:mine"}', handler=missing)
    assert reply["error"]["code"] == "object_not_found" and reply["error"]["operation_id"] == "op:mine"


@pytest.mark.parametrize(("exc", "code"), [
    (psycopg.OperationalError("down"), "service_unavailable"),
    (psycopg.errors.UniqueViolation("dup"), "internal_error"),
    (nats.errors.TimeoutError(), "service_unavailable"),
    (msgspec.ValidationError("bad"), "invalid_request"),
    (KeyError("bug"), "internal_error"),
])
async def test_one_mapping_for_every_failure(exc: BaseException, code: str) -> None:
    assert to_error(exc, "read").code == code


async def test_a_bug_in_a_handler_answers_internal_error() -> None:
    async def bug() -> None:
        raise KeyError("secret content")

    reply, _ = await run(None, handler=bug)
    assert reply["error"]["code"] == "internal_error"
    assert "secret content" not in reply["error"]["message"]
