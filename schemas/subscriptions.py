"""Subscribe (PAMSPEC 10.8, subscription.schema.json): requests to the gateway and what it records.

Unknown fields are rejected; `after_sequence` below 0 or beyond the ledger head is invalid_request.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

import msgspec

from schemas.common import Id
from schemas.envelope import Actor
from schemas.events import EventType

_STRICT: dict[str, bool] = dict(frozen=True, kw_only=True, omit_defaults=True, forbid_unknown_fields=True)
BackpressurePolicy = Literal["drop_oldest", "close_on_lag", "block"]
CloseReason = Literal["unsubscribed", "access_revoked", "scope_deleted", "backpressure", "shutdown"]
Sequence = Annotated[int, msgspec.Meta(ge=0)]


class Filter(msgspec.Struct, **_STRICT):
    """Which events a subscription wants. `predicate` is equality on top-level event fields or on
    `payload.*` / `envelope.*` paths, e.g. {"payload.to": "active", "envelope.object_type": "claim"}."""

    event_classes: Annotated[list[EventType], msgspec.Meta(min_length=1)] | None = None
    object_type: Annotated[str, msgspec.Meta(min_length=1, max_length=256)] | None = None
    object_id: Id | None = None
    predicate: dict[str, str | int | float | bool | None] | None = None


class Delivery(msgspec.Struct, **_STRICT):
    """Delivery preferences (subscription.schema.json `delivery`) plus pamledger's mode and lag bounds."""

    batching_max_events: Annotated[int, msgspec.Meta(ge=1, le=1000)] | None = None
    batching_max_wait_ms: Annotated[int, msgspec.Meta(ge=0, le=60_000)] | None = None
    keepalive_interval_ms: Annotated[int, msgspec.Meta(ge=0, le=600_000)] | None = None
    backpressure_policy: BackpressurePolicy | None = None
    mode: Literal["push", "poll"] = "push"
    # Where pushes go. Default: {prefix}.sub.deliver.<token>, known only from the reply. A client that
    # names its own inbox subscribes BEFORE opening, so not even the first push can be missed.
    subject: Annotated[str, msgspec.Meta(pattern=r"^_INBOX\.[A-Za-z0-9_-]+(\.[A-Za-z0-9_-]+)*\Z",
                                         max_length=200)] | None = None
    max_unacked: Annotated[int, msgspec.Meta(ge=1, le=100_000)] = 1000
    max_lag_ms: Annotated[int, msgspec.Meta(ge=100, le=3_600_000)] = 30_000


class SubscribeRequest(msgspec.Struct, **_STRICT):
    scope_id: Id
    actor: Actor
    filter: Filter = msgspec.field(default_factory=Filter)
    after_sequence: Sequence | None = None
    delivery: Delivery = msgspec.field(default_factory=Delivery)
    operation_id: Id | None = None


class SubscriptionRef(msgspec.Struct, **_STRICT):
    subscription_id: Id


class AckRequest(msgspec.Struct, **_STRICT):
    subscription_id: Id
    ledger_sequence: Annotated[int, msgspec.Meta(ge=1)]


class PollRequest(msgspec.Struct, **_STRICT):
    subscription_id: Id
    max_events: Annotated[int, msgspec.Meta(ge=1, le=1000)] = 100
    wait_ms: Annotated[int, msgspec.Meta(ge=0, le=30_000)] = 1000


InboxSubject = Annotated[str, msgspec.Meta(pattern=r"^_INBOX\.[A-Za-z0-9_-]+(\.[A-Za-z0-9_-]+)*\Z", max_length=200)]


class ResumeRequest(msgspec.Struct, **_STRICT):
    """Re-attach; delivery restarts right after `after_sequence` (the last event the client processed).
    `delivery_subject` (push only): where pushes go from now on, the resuming client's own inbox (with auth
    enforced, under the inbox of the token that resumes; the subscription then goes on under that token)."""

    subscription_id: Id
    after_sequence: Sequence | None = None
    delivery_subject: InboxSubject | None = None


class ListRequest(msgspec.Struct, **_STRICT):
    """`sub.list`: the caller's subscriptions (an administrator's: everyone's), oldest first; `all`: closed
    ones too; at most `limit` (the reply says `truncated` when there were more: one NATS message holds them)."""

    all: bool = False
    limit: Annotated[int, msgspec.Meta(ge=1, le=2000)] = 1000


class CloseRequest(msgspec.Struct, **_STRICT):
    subscription_id: Id
    reason: Annotated[str, msgspec.Meta(max_length=256)] = "unsubscribed"


def descriptor(subscription_id: str, request: SubscribeRequest, start_sequence: int, channel: str) -> dict[str, Any]:
    """The Subscription object (subscription.schema.json) as returned and recorded in the ledger."""
    delivery = {k: v for k, v in msgspec.to_builtins(request.delivery).items()
                if k in ("batching_max_events", "batching_max_wait_ms", "keepalive_interval_ms",
                         "backpressure_policy")}
    return {
        "subscription_id": subscription_id,
        "scope_id": request.scope_id,
        "actor": msgspec.to_builtins(request.actor),
        "filter": msgspec.to_builtins(request.filter),
        "start_sequence": start_sequence,
        "delivery": delivery,
        "channel_ref": channel,
    }
