"""Bad input never crashes the writer and never half-writes: property tests over random commands."""

from __future__ import annotations

from typing import Any

import msgspec
import psycopg
from hypothesis import HealthCheck, given, settings, strategies as st

from memory_client.client import MemoryClient
from schemas.errors import ERROR_CODES, RETRYABLE
from tests.conftest import ACTOR, PROVENANCE, Env

SCOPE = "workspace:fuzz"
COMMANDS = ["create", "update", "transition", "delete", "create_scope", "nonsense"]

json_leaf = st.one_of(st.none(), st.booleans(), st.integers(), st.floats(allow_nan=False), st.text(max_size=20))
json_value = st.recursive(json_leaf, lambda inner: st.one_of(
    st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=10), inner, max_size=4)), max_leaves=12)
VALID_CREATE = {"scope_id": SCOPE, "object_type": "claim", "canonical_content": {"s": 1},
                "actor": ACTOR, "provenance": PROVENANCE}
field_values = {
    "scope_id": st.sampled_from([SCOPE, "workspace:absent", "no-colon", "", "a:b c", 7]),
    "object_type": st.sampled_from(["claim", "banana", "com.example.x", "tool_result", "working_memory", None]),
    "object_id": st.sampled_from(["mem:x", "bad id", "mem:" + "x" * 600, 5]),
    "expected_version_id": st.sampled_from(["ver:nope", "", None]),
    "dimension": st.sampled_from(["lifecycle", "availability", "colour", 3]),
    "target_state": st.sampled_from(["active", "deleted", "scratch", "redacted", ""]),
    "actor": st.one_of(st.just(ACTOR), json_value),
    "provenance": st.one_of(st.just(PROVENANCE), json_value),
    "canonical_content": json_value,
    "unknown_field": json_value,
}
mutated_create = st.fixed_dictionaries({}, optional=field_values).map(lambda extra: {**VALID_CREATE, **extra})
payloads = st.one_of(
    st.binary(max_size=200),
    json_value.map(msgspec.json.encode),
    mutated_create.map(msgspec.json.encode),
    st.just(b"{" * 5000),
    st.just(msgspec.json.encode({**VALID_CREATE, "canonical_content": "x" * 600_000})),
)


def assert_error_envelope(reply: dict[str, Any]) -> None:
    env = reply["error"]
    assert set(env) >= {"code", "message", "retryable", "operation_id", "details"}
    assert env["code"] in ERROR_CODES and env["retryable"] == RETRYABLE[env["code"]]
    assert isinstance(env["message"], str) and isinstance(env["details"], dict)


async def ledger_rows(env: Env) -> int:
    async with await psycopg.AsyncConnection.connect(env.database_url) as conn:
        cur = await conn.execute("SELECT count(*) FROM ledger")
        row = await cur.fetchone()
        return int(row[0]) if row else 0


@settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck))
@given(command=st.sampled_from(COMMANDS), payload=payloads)
async def test_random_commands_get_an_answer_and_write_only_what_succeeded(
    client: MemoryClient, service: Env, command: str, payload: bytes
) -> None:
    await client.create_scope(SCOPE)
    before = await ledger_rows(service)
    msg = await client.nc.request(f"{service.settings.subject_prefix}.cmd.{command}", payload, timeout=20)
    reply = msgspec.json.decode(msg.data)
    after = await ledger_rows(service)
    if "error" in reply:
        assert_error_envelope(reply)
        assert after == before, "a rejected command wrote to the ledger"
    else:
        assert command in ("create", "create_scope"), reply
        assert after == before + (1 if command == "create" else 0)


async def test_the_writer_keeps_serving_after_the_fuzzing(client: MemoryClient) -> None:
    created = await client.create(SCOPE, "claim", {"still": "alive"}, ACTOR, PROVENANCE)
    assert (await client.read(SCOPE, created["object_id"]))["canonical_content"] == {"still": "alive"}


async def test_oversized_payloads_are_invalid_request_naming_the_limit(client: MemoryClient, service: Env) -> None:
    body = msgspec.json.encode({**VALID_CREATE, "canonical_content": "x" * 600_000})
    reply = msgspec.json.decode((await client.nc.request(f"{service.settings.subject_prefix}.cmd.create", body,
                                                        timeout=20)).data)
    assert reply["error"]["code"] == "invalid_request"
    assert reply["error"]["details"]["limit_bytes"] == service.settings.writer.max_payload_bytes


async def test_unknown_fields_and_malformed_json_are_invalid_request(client: MemoryClient, service: Env) -> None:
    subject = f"{service.settings.subject_prefix}.cmd.create"
    for body in (b"{not json", msgspec.json.encode({**VALID_CREATE, "colour": "red"}),
                 msgspec.json.encode({**VALID_CREATE, "scope_id": "no colon"})):
        reply = msgspec.json.decode((await client.nc.request(subject, body, timeout=20)).data)
        assert reply["error"]["code"] == "invalid_request", body
