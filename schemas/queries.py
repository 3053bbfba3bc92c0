"""The Query request: structured filters, lexical text, ordering profile, cursor, freshness and time travel.

Unknown fields, wrong types, empty state lists, inverted ranges, oversized limits and a missing scope are
all invalid_request. Defaults are PAMSPEC's trusted retrieval target: active, available, retained,
corroborated.
"""

from __future__ import annotations

from typing import Annotated, Literal, TypeVar

import msgspec

from schemas.common import AvailabilityState, Id, LifecycleState, RetentionState, Timestamp, Unit, ValidationState
from schemas.errors import InvalidRequest
from pamledger_client.protocol.values import BadValue, check_value
from pamledger_client.protocol.vocabulary import (
    MAX_HOPS as MAX_HOPS,
    QUERY_MAX_LIMIT,
    TIME_FIELDS as TIME_FIELDS,
    Order as Order,
    TimeField as TimeField,
)

# The numeric quality_signals (PAMSPEC 8.7, each in [0, 1]): filters (`quality`) and orders use them. They are
# non-authoritative: a quality filter narrows what the state filters (validation included) let through, never more.
QualitySignal = Literal["assessed_confidence", "contradiction_score", "staleness_score", "evidence_strength",
                        "source_diversity"]
QUALITY_SIGNALS: tuple[str, ...] = QualitySignal.__args__  # type: ignore[attr-defined]
MAX_LIMIT = QUERY_MAX_LIMIT
MAX_WAIT_MS = 10_000


_NonEmpty = msgspec.Meta(min_length=1, max_length=64)
TypeList = Annotated[list[Annotated[str, msgspec.Meta(max_length=1024)]], _NonEmpty]
IdList = Annotated[list[Id], _NonEmpty]
LifecycleList = Annotated[list[LifecycleState], _NonEmpty]
AvailabilityList = Annotated[list[AvailabilityState], _NonEmpty]
RetentionList = Annotated[list[RetentionState], _NonEmpty]
ValidationList = Annotated[list[ValidationState], _NonEmpty]


class TimeRange(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """gte <= t < lt; either bound may be omitted."""

    gte: Timestamp | None = None
    lt: Timestamp | None = None


class SequenceRange(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """gte <= ledger_sequence <= lte."""

    gte: Annotated[int, msgspec.Meta(ge=0)] | None = None
    lte: Annotated[int, msgspec.Meta(ge=0)] | None = None


class UnitRange(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """gte <= signal <= lte (both inclusive; a signal is in [0, 1]); either bound may be omitted."""

    gte: Unit | None = None
    lte: Unit | None = None


class Filters(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """The structured filters Query and Search share (query.plan.filter_clauses turns them into SQL)."""

    object_types: TypeList | None = None
    schema_ids: TypeList | None = None
    # The trusted defaults (pamledger_client.protocol.vocabulary.TRUSTED_STATES: tests/unit/test_client_protocol.py)
    lifecycle_states: LifecycleList = msgspec.field(default_factory=lambda: ["active"])
    availability_states: AvailabilityList = msgspec.field(default_factory=lambda: ["available"])
    retention_states: RetentionList = msgspec.field(default_factory=lambda: ["retained"])
    validation_states: ValidationList = msgspec.field(default_factory=lambda: ["corroborated"])
    actor_ids: IdList | None = None
    provenance_ids: IdList | None = None
    time: dict[TimeField, TimeRange] | None = None
    ledger_sequence: SequenceRange | None = None
    # Objects whose quality_signals carry the signal, within the range (an object without it never matches).
    quality: dict[QualitySignal, UnitRange] | None = None
    # Versions an evaluation run wrote (their provenance.evidence_refs holds `evaluation_run:<id>`).
    evaluation_run_id: Id | None = None


class QueryRequest(Filters, frozen=True, kw_only=True, forbid_unknown_fields=True):
    scope_id: Id
    text: Annotated[str, msgspec.Meta(min_length=1, max_length=512)] | None = None
    order: Order = "newest"
    limit: Annotated[int, msgspec.Meta(ge=1, le=MAX_LIMIT)] = 50
    cursor: Annotated[str, msgspec.Meta(max_length=2048)] | None = None
    min_sequence: Annotated[int, msgspec.Meta(ge=0)] | None = None
    wait_ms: Annotated[int, msgspec.Meta(ge=0, le=MAX_WAIT_MS)] = 2000
    as_of_sequence: Annotated[int, msgspec.Meta(ge=0)] | None = None
    snapshot_id: Id | None = None  # answer at this sealed evaluation snapshot (query.snapshots)
    operation_id: Annotated[str, msgspec.Meta(max_length=512)] | None = None


_decoder = msgspec.json.Decoder(QueryRequest)
R = TypeVar("R")


def decode_request(decoder: msgspec.json.Decoder[R], data: bytes, what: str) -> R:
    """Decode a read request and refuse what no store can hold (e.g. NUL in a text filter, which Postgres
    cannot even compare with); every problem is invalid_request naming what is wrong."""
    try:
        request = decoder.decode(data)
        check_value(msgspec.to_builtins(request))
    except (msgspec.DecodeError, msgspec.ValidationError, RecursionError) as exc:
        raise InvalidRequest(f"malformed {what}: {exc}", details={"reason": str(exc)}) from None
    except BadValue as exc:
        raise InvalidRequest(f"invalid {what}: {exc}", details={"field": exc.path, "reason": exc.reason}) from None
    return request


def decode_query(data: bytes) -> QueryRequest:
    """Decode and check a query; every problem is invalid_request naming what is wrong."""
    request = decode_request(_decoder, data, "query")
    check_ranges(request)
    if request.order == "score" and request.text is None:
        raise InvalidRequest("order 'score' needs a text query", details={"order": "score"})
    if request.snapshot_id is not None and request.as_of_sequence is not None:
        raise InvalidRequest("a snapshot pins its own sequence: send snapshot_id or as_of_sequence, not both",
                             details={"field": "as_of_sequence"})
    return request


def check_quality_ranges(request: Filters) -> None:
    """An inverted quality range (gte > lte) is invalid_request."""
    for signal, bounds in (request.quality or {}).items():
        if bounds.gte is not None and bounds.lte is not None and bounds.gte > bounds.lte:
            raise InvalidRequest(f"quality range {signal} is inverted (gte > lte)", details={"field": f"quality/{signal}"})


def check_ranges(request: Filters) -> None:
    """Empty or inverted time, sequence and quality windows are invalid_request (Query and Search alike)."""
    check_quality_ranges(request)
    for name, window in (request.time or {}).items():
        if window.gte is not None and window.lt is not None and window.gte >= window.lt:
            raise InvalidRequest(f"time range {name} is empty or inverted (gte must be before lt)",
                                 details={"field": name})
    seq = request.ledger_sequence
    if seq is not None and seq.gte is not None and seq.lte is not None and seq.gte > seq.lte:
        raise InvalidRequest("ledger_sequence range is inverted (gte > lte)", details={"field": "ledger_sequence"})


# ---- Query by relationship (query.related): neighbours of an object over current_relationships ----------

Direction = Literal["outgoing", "incoming", "both"]
RelationshipTypeList = Annotated[list[Annotated[str, msgspec.Meta(min_length=1, max_length=256)]], _NonEmpty]


class RelatedRequest(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """The relationships around `from_object_id` and the objects they reach, up to `hops` steps away.

    `direction` is seen from the object a step starts at: outgoing follows directed relationships from their
    source, incoming from their target; bidirectional and undirected ones count both ways. The state
    filters apply to the relationships (default: available ones only, any lifecycle and validation); the
    objects reached are shown whatever their state (a deleted one as `deleted`, never hidden). The start is
    named `from_object_id`, not `object_id`, on purpose: a read under a delegation restricted to some objects
    is checked per named object, and a traversal reaches objects the request does not name, so it is checked
    like a query over the whole scope (authz.exercise's `whole_scope`)."""

    scope_id: Id
    from_object_id: Id
    relationship_types: RelationshipTypeList | None = None
    direction: Direction = "both"
    hops: Annotated[int, msgspec.Meta(ge=1, le=MAX_HOPS)] = 1
    limit: Annotated[int, msgspec.Meta(ge=1, le=MAX_LIMIT)] = 50
    availability_states: AvailabilityList = msgspec.field(default_factory=lambda: ["available"])
    lifecycle_states: LifecycleList | None = None
    retention_states: RetentionList | None = None
    validation_states: ValidationList | None = None
    min_sequence: Annotated[int, msgspec.Meta(ge=0)] | None = None
    wait_ms: Annotated[int, msgspec.Meta(ge=0, le=MAX_WAIT_MS)] = 2000
    snapshot_id: Id | None = None  # the relationships between the sealed snapshot's members at its watermark
    operation_id: Annotated[str, msgspec.Meta(max_length=512)] | None = None


_related_decoder = msgspec.json.Decoder(RelatedRequest)


def decode_related(data: bytes) -> RelatedRequest:
    """Decode and check a query.related request; every problem is invalid_request naming what is wrong."""
    request = decode_request(_related_decoder, data, "related request")
    if request.snapshot_id is not None and request.min_sequence is not None:
        raise InvalidRequest("a snapshot pins its own sequence: send snapshot_id or min_sequence, not both",
                             details={"field": "min_sequence"})
    return request
