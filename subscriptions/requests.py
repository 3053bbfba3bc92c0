"""Decoding what the gateway reads: Subscribe requests off the wire, and the requests stored with each row.

Why apart: bad input is refused at the door, before any state changes (a NUL in a close `reason` once
stopped a subscription's delivery and then failed in Postgres, leaving it half-closed). Every decoded
request passes pamledger_client.protocol.values.check_value, as commands and queries do. A stored request that no longer
decodes is one bad row, not a gateway that cannot start: it is set aside and reported.
"""

from __future__ import annotations

from typing import Any

import msgspec
import structlog

from infra.stuck import describe
from schemas.canonical import canonical_bytes
from schemas.errors import InvalidRequest
from schemas.subscriptions import (
    AckRequest, CloseRequest, ListRequest, PollRequest, ResumeRequest, SubscribeRequest, SubscriptionRef,
)
from pamledger_client.protocol.values import BadValue, check_value

log = structlog.get_logger(__name__)
DECODERS: dict[str, Any] = {
    "open": msgspec.json.Decoder(SubscribeRequest), "ack": msgspec.json.Decoder(AckRequest),
    "poll": msgspec.json.Decoder(PollRequest), "resume": msgspec.json.Decoder(ResumeRequest),
    "close": msgspec.json.Decoder(CloseRequest), "status": msgspec.json.Decoder(SubscriptionRef),
    "list": msgspec.json.Decoder(ListRequest),
}
_STORED = DECODERS["open"]


def decode_request(name: str, data: bytes) -> Any:
    """The `name` request in `data`; raises InvalidRequest for malformed JSON, a schema violation, or a
    value no store can hold (NUL, NaN, nesting past the documented depth), naming the field."""
    try:
        request = DECODERS[name].decode(data)
        check_value(msgspec.to_builtins(request))
    except (msgspec.DecodeError, msgspec.ValidationError, RecursionError) as exc:
        raise InvalidRequest(f"malformed {name} request: {exc}", details={"reason": str(exc)}) from None
    except BadValue as exc:
        raise InvalidRequest(f"invalid {name} request: {exc}",
                             details={"field": exc.path, "reason": exc.reason}) from None
    return request


def decode_stored(rows: list[tuple[Any, ...]], unreadable: dict[str, str]) -> list[tuple[Any, ...]]:
    """Rows (subscription_id, stored request bytes, *rest) with the request decoded. A row whose request
    does not decode is left out, logged, and recorded in `unreadable` (id -> reason), so the others are
    taken over (the gateway reads its rows once as it starts leading: one log line per bad row)."""
    decoded = []
    for subscription_id, raw, *rest in rows:
        try:
            decoded.append((subscription_id, _STORED.decode(raw), *rest))
        except Exception as exc:  # noqa: BLE001 - one bad row must not stop the others
            unreadable[subscription_id] = describe(exc)
            log.error("subscription.unreadable", subscription_id=subscription_id, reason=unreadable[subscription_id])
    return decoded


def result_body(result: dict[str, Any]) -> bytes:
    return canonical_bytes({"result": result})
