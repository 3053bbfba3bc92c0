"""Opaque, stable pagination cursors bound to the query that made them and to the caller that received them.

A cursor is `<body>.<key id>.<mac>`: the body (base64url canonical JSON: the query's digest, the last row's
sort key, the pinned sequence, the caller's tag) signed with HMAC-SHA256 by a key only the service holds
(query.cursor_keys). A cursor the service did not make, or made for another caller, is invalid_request before
any of it is read. A verified cursor is still checked like input (its sort key must have the shape and types of
the query's sort key): a key file leaked or shared with another service must not reach Postgres unchecked.
"""

from __future__ import annotations

import base64
import hashlib
import math
from typing import Any

import msgspec

from query.cursor_keys import CursorSigner
from query.plan import sort_key
from schemas.queries import QueryRequest
from schemas.canonical import canonical_bytes, decode_json
from schemas.common import Timestamp
from schemas.errors import InvalidRequest

_BIGINT_LIMIT = 2**63

_UNBOUND = ("cursor", "limit", "min_sequence", "wait_ms", "operation_id")


def query_digest(request: QueryRequest) -> str:
    """What makes two requests 'the same query' (paging and freshness knobs excluded)."""
    plain = msgspec.to_builtins(request)
    for name in _UNBOUND:
        plain.pop(name, None)
    return hashlib.sha256(canonical_bytes(plain)).hexdigest()[:32]


def encode_cursor(request: QueryRequest, key: list[Any], as_of: int | None, signer: CursorSigner, caller: str) -> str:
    """The cursor for the page after the row whose sort key is `key`, signed, bound to `caller`
    (cursor_keys.caller_tag)."""
    body = canonical_bytes({"q": query_digest(request), "k": msgspec.to_builtins(key), "a": as_of, "c": caller})
    text = base64.urlsafe_b64encode(body).decode().rstrip("=")
    return f"{text}.{signer.sign(body)}"


def decode_cursor(request: QueryRequest, signer: CursorSigner, caller: str) -> tuple[list[Any] | None, int | None]:
    """(last sort key, pinned as_of_sequence) from the request's cursor; invalid_request if the service did
    not make it, made it for another caller or another query."""
    if request.cursor is None:
        return None, None
    not_ours = InvalidRequest("cursor is not a pamledger query cursor", details={"cursor": request.cursor[:200]})
    parts = request.cursor.split(".")
    if len(parts) != 3:
        raise not_ours
    text, key_id, mac = parts
    try:
        body = base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))
    except (ValueError, TypeError):
        raise not_ours from None
    if not signer.verify(key_id, body, mac):
        raise not_ours
    try:
        plain = decode_json(body)
        digest, key, as_of, bound = plain["q"], plain["k"], plain["a"], plain["c"]
    except (ValueError, KeyError, TypeError, msgspec.DecodeError):
        raise not_ours from None
    if bound != caller:
        raise InvalidRequest("cursor was given to another caller", details={"cursor": request.cursor[:200]})
    if digest != query_digest(request) or not isinstance(key, list):
        raise InvalidRequest("cursor belongs to a different query", details={"cursor": request.cursor[:200]})
    if not (_valid_key(request, key) and (as_of is None or _is_bigint(as_of))):
        raise InvalidRequest("cursor's sort key does not fit this query", details={"cursor": request.cursor[:200]})
    return key, as_of


def _valid_key(request: QueryRequest, key: list[Any]) -> bool:
    """True when key holds one value of the right type for each column of the query's sort key."""
    params = [param for _, _, param in sort_key(request)[0]]
    return len(key) == len(params) and all(_fits(param, value) for param, value in zip(params, key))


def _fits(param: str, value: Any) -> bool:
    if "::timestamptz" in param:  # a nullable time column sorts through coalesce, so null is a real key
        return (value is None and param.startswith("coalesce")) or _is_timestamp(value)
    if "::double precision" in param:  # a quality signal: null (absent) is a real key, as for time fields
        return (value is None and param.startswith("coalesce")) or (type(value) in (int, float) and math.isfinite(value))
    if param.endswith("::bigint"):
        return _is_bigint(value)
    if param.endswith("::real"):
        return type(value) in (int, float) and math.isfinite(value)
    return type(value) is str and len(value) <= 512 and "\x00" not in value


def _is_bigint(value: Any) -> bool:
    return type(value) is int and 0 <= value < _BIGINT_LIMIT


def _is_timestamp(value: Any) -> bool:
    if type(value) is not str:
        return False
    try:
        msgspec.convert(value, Timestamp)
    except msgspec.ValidationError:
        return False
    return True
