"""The Search request's own checks: everything wrong with the request alone is invalid_request."""

from __future__ import annotations

from typing import Any

import msgspec
import pytest

from embedding import text_profile
from schemas.errors import InvalidRequest
from schemas.queries import Filters, QueryRequest
from schemas.search import MAX_TEXT_CHARS, SearchRequest, decode_search

SCOPE = {"scope_id": "workspace:x"}


def decode(body: dict[str, Any]) -> SearchRequest:
    return decode_search(msgspec.json.encode({**SCOPE, **body}))


def test_the_text_limit_is_the_profiles_so_no_query_is_cut_silently() -> None:
    assert MAX_TEXT_CHARS == text_profile.MAX_CHARS
    assert decode({"text": "x" * MAX_TEXT_CHARS}).text == "x" * MAX_TEXT_CHARS


def test_defaults_are_hybrid_ten_and_the_trusted_target() -> None:
    request = decode({"text": "kettle"})
    assert (request.mode, request.limit, request.embedding_space_id) == ("hybrid", 10, None)
    assert (request.lifecycle_states, request.validation_states) == (["active"], ["corroborated"])


def test_query_and_search_share_one_definition_of_the_filters() -> None:
    assert issubclass(SearchRequest, Filters) and issubclass(QueryRequest, Filters)
    for name in Filters.__struct_fields__:
        assert name in SearchRequest.__struct_fields__


@pytest.mark.parametrize("body", [
    {}, {"text": "a", "vector": [1.0]}, {"vector": [1.0], "mode": "lexical"}, {"text": " \t\n"}, {"text": ""},
    {"text": "x" * (MAX_TEXT_CHARS + 1)}, {"text": "a", "limit": 101}, {"text": "a", "limit": 0},
    {"vector": []}, {"vector": [0.0] * 2001}, {"vector": [0.0, -0.0]}, {"text": "a", "mode": "exact"}, {"text": "a", "extra": 1},
    {"text": "a", "wait_ms": -1}, {"text": "a", "lifecycle_states": []}, {"text": "a\u0000"},
    {"text": "a", "ledger_sequence": {"gte": 5, "lte": 2}},
])
def test_bad_requests_are_invalid_requests(body: dict[str, Any]) -> None:
    with pytest.raises(InvalidRequest):
        decode(body)


@pytest.mark.parametrize("raw", [b'{"scope_id":"workspace:x","vector":[1e999]}',
                                 b'{"scope_id":"workspace:x","vector":[NaN]}',
                                 b'{"scope_id":"workspace:x","vector":[-Infinity]}'])
def test_non_finite_vectors_never_decode(raw: bytes) -> None:
    with pytest.raises(InvalidRequest):
        decode_search(raw)
