"""Checks of request headers that stand for payload fields: the same limits and refused values.

Why here (pure, in the kernel): the writer's intake and the request shell of every other service read the
same headers, and a header must never be looser than the field it stands for.
"""

from __future__ import annotations

from schemas.common import is_valid_id
from schemas.errors import InvalidRequest
from schemas.replies import OPERATION_HEADER
from pamledger_client.protocol.values import BadValue, check_text

OPERATION_ID_MAX_CHARS = 512


def check_header(name: str, value: str, max_chars: int) -> None:
    """Headers are input too: the same length limit and refused values as the payload field they stand for."""
    field = f"headers/{name}"
    if len(value) > max_chars:
        raise InvalidRequest(f"header {name} is longer than {max_chars} characters",
                             details={"field": field, "limit_chars": max_chars, "length": len(value)})
    try:
        check_text(value, field)
    except BadValue as exc:
        raise InvalidRequest(f"header {name}: {exc}", details={"field": field, "reason": exc.reason}) from None


def header_operation_id(headers: dict[str, str] | None) -> str | None:
    """The `Pam-Operation-Id` header, checked like the payload's operation id (None: absent or empty)."""
    value = (headers or {}).get(OPERATION_HEADER)
    if not value:
        return None
    check_header(OPERATION_HEADER, value, OPERATION_ID_MAX_CHARS)
    if not is_valid_id(value):
        raise InvalidRequest("operation id must follow the scheme:rest id pattern",
                             details={"field": f"headers/{OPERATION_HEADER}", "operation_id": value})
    return value
