"""The value checker: what no derived store can hold is found in one pass, with the path to it."""

from __future__ import annotations

from typing import Any

import pytest

from command_handler.core.intake import parse
from schemas.common import is_extension_type, is_valid_id
from schemas.errors import InvalidObject, InvalidRequest
from pamledger_client.protocol.values import MAX_DEPTH, BadValue, check_text, check_value


def nested(levels: int) -> Any:
    value: Any = 1
    for _ in range(levels):
        value = [value]
    return value


@pytest.mark.parametrize("value, path, reason", [
    ({"canonical_content": {"s": "a\x00b"}}, "/canonical_content/s", "NUL"),
    ({"canonical_content": {"a\x00": 1}}, "/canonical_content/a\\u0000", "NUL"),
    ({"canonical_content": [1, [2, "\x00"]]}, "/canonical_content/1/1", "NUL"),
    ({"canonical_content": {"x": float("nan")}}, "/canonical_content/x", "NaN"),
    ({"canonical_content": [float("inf")]}, "/canonical_content/0", "Infinity"),
    ({"canonical_content": {"a/b": {"~": -float("inf")}}}, "/canonical_content/a~1b/~0", "Infinity"),
    ({"idempotency_key": "k\x00"}, "/idempotency_key", "NUL"),
    ("\x00", "/", "NUL"),
    ({"canonical_content": nested(MAX_DEPTH + 1)}, "/canonical_content" + "/0" * MAX_DEPTH, "nesting"),
])
def test_bad_values_are_found_with_their_path(value: Any, path: str, reason: str) -> None:
    with pytest.raises(BadValue) as caught:
        check_value(value)
    assert caught.value.path == path and reason in caught.value.reason


def test_values_a_store_can_hold_pass_up_to_the_depth_limit() -> None:
    check_value({"canonical_content": nested(MAX_DEPTH), "s": "é ü 中 😀", "n": [0, -1, 1.5, 1e308, True, None]})


def test_content_values_are_invalid_object_and_command_fields_invalid_request() -> None:
    assert BadValue("/canonical_content/s", "x").code == "invalid_object"
    assert BadValue("/schema_id", "x").code == "invalid_object"
    assert BadValue("/idempotency_key", "x").code == "invalid_request"
    assert BadValue("/", "x").code == "invalid_request"


def test_check_text_refuses_nul_and_lone_surrogates() -> None:
    check_text("plain é", "headers/x")
    for bad in ("a\x00", "a\ud800"):
        with pytest.raises(BadValue):
            check_text(bad, "headers/x")


def test_ids_and_type_patterns_refuse_a_trailing_newline() -> None:
    assert is_valid_id("workspace:x") and not is_valid_id("workspace:x\n")
    assert is_extension_type("com.example.note") and not is_extension_type("com.example.note\n")


def test_parse_survives_nesting_that_exhausts_the_decoders_recursion() -> None:
    body = (b'{"scope_id":"workspace:a","object_type":"claim","actor":{"actor_id":"actor:a","actor_kind":"agent"},'
            b'"provenance":{"provenance_id":"prov:a","actor":{"actor_id":"actor:a","actor_kind":"agent"},'
            b'"activity":"t"},"canonical_content":' + b"[" * 5000 + b"]" * 5000 + b"}")
    with pytest.raises(InvalidObject) as caught:
        parse("create", body, None, 1 << 20)
    assert caught.value.details["max_depth"] == MAX_DEPTH


def test_an_over_long_idempotency_header_is_invalid_request() -> None:
    body = b'{"scope_id":"workspace:a","scope_kind":"workspace"}'
    parse("create_scope", body, {"Pam-Idempotency-Key": "k" * 256}, 1 << 20)
    with pytest.raises(InvalidRequest) as caught:
        parse("create_scope", body, {"Pam-Idempotency-Key": "k" * 257}, 1 << 20)
    assert caught.value.details["field"] == "headers/Pam-Idempotency-Key"


def test_the_depth_only_walk_counts_as_the_full_walk_does() -> None:
    from pamledger_client.protocol.values import nests_deeper

    assert not nests_deeper({"canonical_content": nested(MAX_DEPTH), "x": [{"y": [1]}]})
    assert nests_deeper({"a": 1, "canonical_content": {"k": nested(MAX_DEPTH)}})
    assert not nests_deeper({"s": "x", "n": [1, 2]}, max_depth=1) and nests_deeper({"n": [[1]]}, max_depth=1)
