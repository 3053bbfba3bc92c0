"""Opaque, stable pagination cursors bound to the query that made them."""

from __future__ import annotations

import base64
import hashlib
from typing import Any

import msgspec

from query.request import QueryRequest
from schemas.canonical import canonical_bytes, decode_json
from schemas.errors import InvalidRequest

_UNBOUND = ("cursor", "limit", "min_sequence", "wait_ms", "operation_id")


def query_digest(request: QueryRequest) -> str:
    """What makes two requests 'the same query' (paging and freshness knobs excluded)."""
    plain = msgspec.to_builtins(request)
    for name in _UNBOUND:
        plain.pop(name, None)
    return hashlib.sha256(canonical_bytes(plain)).hexdigest()[:32]


def encode_cursor(request: QueryRequest, key: list[Any], as_of: int | None) -> str:
    body = canonical_bytes({"q": query_digest(request), "k": msgspec.to_builtins(key), "a": as_of})
    return base64.urlsafe_b64encode(body).decode().rstrip("=")


def decode_cursor(request: QueryRequest) -> tuple[list[Any] | None, int | None]:
    """(last sort key, pinned as_of_sequence) from the request's cursor; invalid_request if it is not ours."""
    if request.cursor is None:
        return None, None
    try:
        body = decode_json(base64.urlsafe_b64decode(request.cursor + "=" * (-len(request.cursor) % 4)))
        digest, key, as_of = body["q"], body["k"], body["a"]
    except (ValueError, KeyError, TypeError, msgspec.DecodeError):
        raise InvalidRequest("cursor is not a pamledger query cursor", details={"cursor": request.cursor}) from None
    if digest != query_digest(request) or not isinstance(key, list):
        raise InvalidRequest("cursor belongs to a different query", details={"cursor": request.cursor})
    return key, as_of
