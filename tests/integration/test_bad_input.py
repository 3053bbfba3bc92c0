"""Bad input never crashes the writer and never half-writes: property tests over random commands."""

from __future__ import annotations

import asyncio
import base64
from typing import Any

import msgspec
import psycopg
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from pamledger_client.client import MemoryClient, PamspecError
from schemas.errors import ERROR_CODES, RETRYABLE
from tests.conftest import ACTOR, PROVENANCE, Env

SCOPE = "workspace:fuzz"
COMMANDS = ["create", "update", "transition", "delete", "create_scope", "relate", "redact", "promote",
            "correct_provenance", "nonsense"]

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


# --- Values no derived store can hold, deep nesting, headers, ids, query input (issue #11 items 1-3) -------



async def send(service: Env, nc: Any, command: str, body: bytes, headers: dict[str, str] | None = None,
               kind: str = "cmd") -> dict[str, Any]:
    msg = await nc.request(f"{service.settings.subject_prefix}.{kind}.{command}", body, timeout=20, headers=headers)
    return msgspec.json.decode(msg.data)  # type: ignore[no-any-return]


RELATE = {"scope_id": SCOPE, "source_object_id": "mem:a", "target_object_id": "mem:b", "relationship_type": "supports",
          "directionality": "directed", "actor": ACTOR, "provenance": PROVENANCE}
REDACT = {"scope_id": SCOPE, "object_id": "mem:a", "expected_version_id": "ver:a", "actor": ACTOR,
          "provenance": PROVENANCE, "policy_basis": "p"}
PROMOTE = {"scope_id": SCOPE, "source_object_id": "mem:a", "expected_version_id": "ver:a", "target_object_type": "claim",
           "target_canonical_content": {}, "actor": ACTOR, "provenance": PROVENANCE}


def create_body(**changes: Any) -> bytes:
    """A create with these fields changed; the strings "__inf__" and "__-inf__" become 1e999 and -1e999
    (JSON has no literal for them, and msgspec decodes such numbers to ±inf)."""
    body = msgspec.json.encode({**VALID_CREATE, **changes})
    return body.replace(b'"__inf__"', b"1e999").replace(b'"__-inf__"', b"-1e999")


def nested_content(levels: int) -> bytes:
    return (msgspec.json.encode({**VALID_CREATE, "canonical_content": "__deep__"})
            .replace(b'"__deep__"', b"[" * levels + b"]" * levels))


async def assert_refused(service: Env, client: MemoryClient, command: str, body: bytes, code: str,
                         field: str | None = None, headers: dict[str, str] | None = None) -> dict[str, Any]:
    """The command is refused with `code` (naming `field`), and the ledger head does not move."""
    await client.create_scope(SCOPE)
    before = await ledger_rows(service)
    reply = await send(service, client.nc, command, body, headers)
    assert "error" in reply, reply
    assert_error_envelope(reply)
    assert reply["error"]["code"] == code, reply
    if field is not None:
        assert reply["error"]["details"]["field"] == field, reply
    assert await ledger_rows(service) == before, "a refused command wrote to the ledger"
    return reply


@pytest.mark.parametrize("command, body, code, field", [
    ("create", create_body(canonical_content={"s": "a\x00b"}), "invalid_object", "/canonical_content/s"),
    ("create", create_body(canonical_content={"k\x00": 1}), "invalid_object", "/canonical_content/k\\u0000"),
    ("create", create_body(canonical_content={"deep": [1, {"s": "\x00"}]}), "invalid_object",
     "/canonical_content/deep/1/s"),
    ("create", create_body(canonical_content={"x": "__inf__"}), "invalid_object", "/canonical_content/x"),
    ("create", create_body(canonical_content=[1, "__-inf__"]), "invalid_object", "/canonical_content/1"),
    ("create", create_body(object_type="com.example.note", schema_id="urn:x\x00y"), "invalid_object", "/schema_id"),
    ("create", create_body(actor={**ACTOR, "display_name": "a\x00"}), "invalid_object", "/actor/display_name"),
    ("create", create_body(object_type="claim\x00"), "invalid_request", "/object_type"),
    ("create", create_body(idempotency_key="key\x00"), "invalid_request", "/idempotency_key"),
    ("create_scope", msgspec.json.encode({"scope_id": "workspace:nul", "scope_kind": "work\x00space"}),
     "invalid_request", "/scope_kind"),
    # [M5] commands: the same door, the same answers
    ("relate", msgspec.json.encode({**RELATE, "relationship_type": "supports\x00"}), "invalid_request",
     "/relationship_type"),
    ("relate", msgspec.json.encode({**RELATE, "canonical_content": {"w": "a\x00"}}), "invalid_object",
     "/canonical_content/w"),
    ("redact", msgspec.json.encode({**REDACT, "redaction_target": {"pointers": ["/s\x00"]}}), "invalid_request",
     "/redaction_target/pointers/0"),
    ("promote", msgspec.json.encode({**PROMOTE, "target_canonical_content": {"s": "\x00"}}), "invalid_object",
     "/target_canonical_content/s"),
    ("correct_provenance", msgspec.json.encode({**REDACT, "removed_fields": ["a\x00"]}), "invalid_request",
     "/removed_fields/0"),
])
async def test_values_no_store_can_hold_are_refused_naming_the_field(
    client: MemoryClient, service: Env, command: str, body: bytes, code: str, field: str
) -> None:
    await assert_refused(service, client, command, body, code, field)


async def test_a_lone_surrogate_is_refused_by_the_decoder(client: MemoryClient, service: Env) -> None:
    body = create_body(canonical_content="__s__").replace(b'"__s__"', b'"\\ud800"')
    await assert_refused(service, client, "create", body, "invalid_request")


@pytest.mark.parametrize("levels", [65, 1000, 50_000])
async def test_nesting_past_the_documented_depth_is_invalid_object(
    client: MemoryClient, service: Env, levels: int
) -> None:
    reply = await assert_refused(service, client, "create", nested_content(levels), "invalid_object")
    assert reply["error"]["details"].get("max_depth", 64) == 64


async def test_nesting_up_to_the_documented_depth_is_stored(client: MemoryClient, service: Env) -> None:
    await client.create_scope(SCOPE)
    reply = await send(service, client.nc, "create", nested_content(64))
    assert "result" in reply, reply


async def test_a_poisonous_command_costs_its_batch_mates_nothing(client: MemoryClient, service: Env) -> None:
    """Sent together, so they share a batch: the deep one is refused, every other one commits and is answered."""
    await client.create_scope(SCOPE)
    before = await ledger_rows(service)
    good = [create_body(canonical_content={"mate": i}) for i in range(6)]
    bodies = good[:3] + [nested_content(1000)] + good[3:]
    replies = await asyncio.gather(*(send(service, client.nc, "create", body) for body in bodies))
    assert replies[3]["error"]["code"] == "invalid_object"
    assert all("result" in r for i, r in enumerate(replies) if i != 3), replies
    assert await ledger_rows(service) == before + len(good)


@pytest.mark.parametrize("stage", ["parse", "decide", "render"])
async def test_an_unexpected_exception_answers_its_own_command_internal_error(
    client: MemoryClient, service: Env, monkeypatch: pytest.MonkeyPatch, stage: str
) -> None:
    """A bug hit by one command (injected here into the writer's own parse, decide or reply rendering)
    answers that command internal_error (or, once it committed, the result it knows: `reply_incomplete`);
    its batch-mates commit and are answered; the writer serves on."""
    import command_handler.core.planner as planner
    import command_handler.writer as writer

    def boom(found: bool) -> None:
        if found:
            raise RuntimeError(f"injected {stage} bug")

    if stage == "parse":
        real_parse = writer.parse
        monkeypatch.setattr(writer, "parse", lambda name, data, *a: boom(b"boom" in data) or real_parse(name, data, *a))
    elif stage == "decide":
        real_decide = planner.decide
        monkeypatch.setattr(planner, "decide", lambda head, command, *rest: boom(
            getattr(command, "canonical_content", None) == {"boom": True}) or real_decide(head, command, *rest))
    else:
        real_render = writer.result_bytes
        monkeypatch.setattr(writer, "result_bytes", lambda head, seq, event_id, content: boom(
            content is not None and b"boom" in content) or real_render(head, seq, event_id, content))
    await client.create_scope(SCOPE)
    before = await ledger_rows(service)
    bodies = [create_body(canonical_content={"boom": True})] + [create_body(canonical_content={"n": i}) for i in range(5)]
    replies = await asyncio.gather(*(send(service, client.nc, "create", body) for body in bodies))
    if stage == "render":
        assert replies[0]["result"]["reply_incomplete"] is True, replies[0]
    else:
        assert replies[0]["error"]["code"] == "internal_error", replies[0]
    assert all("result" in r for r in replies[1:]), replies
    committed = len(bodies) if stage == "render" else len(bodies) - 1  # a reply that fails after COMMIT
    assert await ledger_rows(service) == before + committed
    monkeypatch.undo()
    assert "result" in await send(service, client.nc, "create", create_body(canonical_content={"after": stage}))


@pytest.mark.parametrize("headers", [
    {"Pam-Idempotency-Key": "k" * 257},
    {"Pam-Idempotency-Key": "k" * 20_000},
    {"Pam-Idempotency-Key": "k\x00k"},
    {"Pam-Operation-Id": "op:" + "x" * 600},
])
async def test_headers_get_the_limits_of_the_payload_fields(
    client: MemoryClient, service: Env, headers: dict[str, str]
) -> None:
    name = next(iter(headers))
    await assert_refused(service, client, "create", create_body(canonical_content={"h": 1}), "invalid_request",
                         f"headers/{name}", headers)


@pytest.mark.parametrize("command, body", [
    ("create_scope", msgspec.json.encode({"scope_id": "workspace:nl\n", "scope_kind": "workspace"})),
    ("create", create_body(scope_id=SCOPE + "\n")),
    ("create", create_body(object_id="mem:nl\n")),
    ("create", create_body(operation_id="op:nl\n")),
    ("create", create_body(actor={**ACTOR, "actor_id": "actor:nl\n"})),
])
async def test_ids_with_a_trailing_newline_are_invalid(client: MemoryClient, service: Env, command: str,
                                                      body: bytes) -> None:
    await assert_refused(service, client, command, body, "invalid_object" if b"actor:nl" in body else "invalid_request")


def forged_cursor(service: Env, query: dict[str, Any], key: Any, as_of: Any = None,
                  caller: str | None = None) -> str:
    """A cursor with this sort key, signed with the module's own cursor key (a leaked key: what the shape
    checks behind the signature are for) for the caller a bare NATS request is (anonymous), unless told."""
    from infra.request_shell import ANONYMOUS
    from query.cursor import query_digest
    from query.cursor_keys import CursorSigner, caller_tag
    from schemas.queries import decode_query
    from schemas.canonical import canonical_bytes

    tag = caller or caller_tag(ANONYMOUS.actor_id, None)
    body = canonical_bytes({"q": query_digest(decode_query(msgspec.json.encode(query))), "k": key, "a": as_of,
                            "c": tag})
    signer = CursorSigner(service.settings.query.cursor_keys, service.settings.query.cursor_key_grace_seconds)
    return base64.urlsafe_b64encode(body).decode().rstrip("=") + "." + signer.sign(body)


QUERY = {"scope_id": SCOPE, "validation_states": ["unverified"]}
OBSERVED = {**QUERY, "order": "observed_at_desc"}


@pytest.mark.parametrize("query,forged", [
    ({**QUERY, "text": "a\x00b"}, None),
    ({**QUERY, "object_types": ["claim\x00"]}, None),
    (QUERY, ([["x"], "mem:a", "ver:a"], None)),
    (QUERY, ([1, {"x": 1}, "ver:a"], None)),
    (QUERY, ([1, "mem:a"], None)),
    (QUERY, ([1, "mem:a", "ver:a"], "7")),
    (OBSERVED, (["yesterday", 1, "mem:a", "ver:a"], None)),
])
async def test_bad_query_input_is_invalid_request_before_postgres(client: MemoryClient, service: Env,
                                                                  query: dict[str, Any], forged: Any) -> None:
    await client.create_scope(SCOPE)
    if forged is not None:
        query = {**query, "cursor": forged_cursor(service, query, *forged)}
    reply = await send(service, client.nc, "query", msgspec.json.encode(query), kind="query")
    assert reply.get("error", {}).get("code") == "invalid_request", reply
    if forged is not None:  # refused by the shape check behind the signature, not by the signature
        assert "does not fit" in reply["error"]["message"], reply


async def test_a_forged_cursor_of_a_valid_shape_passes_the_signature(client: MemoryClient, service: Env) -> None:
    """The control for the forgeries above: forged_cursor signs with the module's key for the anonymous
    caller, so a well-shaped one pages (their refusals are the shape checks', not the signature's)."""
    await client.create_scope(SCOPE)
    query = {**QUERY, "cursor": forged_cursor(service, QUERY, [1, "mem:a", "ver:a"])}
    reply = await send(service, client.nc, "query", msgspec.json.encode(query), kind="query")
    assert "result" in reply, reply


async def test_a_well_formed_cursor_still_pages(client: MemoryClient, service: Env) -> None:
    """The cursor checks refuse only forgeries: a key with a null time (sorted through coalesce) passes."""
    await client.create_scope(SCOPE)
    for n in range(2):
        await client.create(SCOPE, "claim", {"page": n}, ACTOR, PROVENANCE)
    for order in ("newest", "observed_at_desc"):
        query = {**QUERY, "order": order, "limit": 1}
        first = await client.query(**query)
        assert first["next_cursor"], first
        second = await client.query(**query, cursor=first["next_cursor"])
        assert second["items"] and second["items"] != first["items"]


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -float("inf")])
async def test_the_sdk_refuses_nan_and_infinity_instead_of_sending_null(client: MemoryClient, service: Env,
                                                                      bad: float) -> None:
    await client.create_scope(SCOPE)
    before = await ledger_rows(service)
    with pytest.raises(PamspecError) as caught:
        await client.create(SCOPE, "claim", {"score": [1.0, bad]}, ACTOR, PROVENANCE)
    assert caught.value.code == "invalid_object" and caught.value.details["field"] == "/canonical_content/score/1"
    assert await ledger_rows(service) == before
