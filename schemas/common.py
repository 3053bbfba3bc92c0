"""Shared wire vocabulary: identifiers, the four state dimensions, object types, timestamps."""

from __future__ import annotations

import re
from datetime import datetime, timezone
from typing import Annotated, Literal

import msgspec

# Patterns end in `\Z`, never `$`: `$` also matches before a final newline, so `workspace:x\n` would pass
# as an id of its own (msgspec applies patterns with re.search).
ID_PATTERN = r"^[A-Za-z][A-Za-z0-9+.\-]*:[A-Za-z0-9+._:\-/]+\Z"
_ID = re.compile(ID_PATTERN)
EXTENSION_TYPE_PATTERNS = (
    re.compile(r"^[a-z0-9]+(?:\.[a-z0-9-]+)+\.[a-z][a-z0-9-]*\Z"),
    re.compile(r"^[a-z][a-z0-9+.-]*:"),
)
SPEC_VERSION = "0.1.0-draft"
# The scope of the service's own ledger entries (space registrations, the default space switch): migration 008.
SYSTEM_SCOPE = "system:pamledger"

Id = Annotated[str, msgspec.Meta(pattern=ID_PATTERN, max_length=512)]
ObjectType = Annotated[str, msgspec.Meta(min_length=1, max_length=256)]
IDEMPOTENCY_KEY_MAX = 256
IdempotencyKey = Annotated[str, msgspec.Meta(min_length=1, max_length=IDEMPOTENCY_KEY_MAX)]
# Every command Struct: immutable, keyword-only, unset optional fields left out of its bytes, unknown fields
# refused (schemas.commands, delegation, redaction, relationship).
COMMAND_STRUCT: dict[str, bool] = dict(frozen=True, kw_only=True, omit_defaults=True, forbid_unknown_fields=True)
Text = Annotated[str, msgspec.Meta(max_length=4096)]
Timestamp = Annotated[datetime, msgspec.Meta(tz=True)]
Unit = Annotated[float, msgspec.Meta(ge=0, le=1)]

LifecycleState = Literal["scratch", "candidate", "active", "superseded", "deprecated", "archived"]
AvailabilityState = Literal["available", "partially_redacted", "redacted", "deleted"]
RetentionState = Literal["retained", "expired", "pending_deletion", "legal_hold"]
ValidationState = Literal["unverified", "corroborated", "disputed", "rejected"]
Dimension = Literal["lifecycle", "availability", "retention", "validation"]

STANDARD_OBJECT_TYPES = frozenset(
    {
        "claim", "decision", "task", "artifact", "observation", "entity", "summary",
        "tool_invocation", "tool_result", "working_memory",
    }
)

DIMENSION_STATES: dict[str, frozenset[str]] = {
    "lifecycle": frozenset(LifecycleState.__args__),  # type: ignore[attr-defined]
    "availability": frozenset(AvailabilityState.__args__),  # type: ignore[attr-defined]
    "retention": frozenset(RetentionState.__args__),  # type: ignore[attr-defined]
    "validation": frozenset(ValidationState.__args__),  # type: ignore[attr-defined]
}


def is_extension_type(object_type: str) -> bool:
    """True for reverse-DNS or URI object types, which PAMSPEC allows with a schema_id."""
    return any(p.match(object_type) for p in EXTENSION_TYPE_PATTERNS)


def is_valid_id(value: str) -> bool:
    """True when value follows the PAMSPEC `scheme:rest` identifier pattern."""
    return len(value) <= 512 and _ID.match(value) is not None


def timestamp_text(moment: datetime) -> str:
    """UTC with six fraction digits and a four-digit year: every recorded time has one width, so the texts
    compare as the times do (strftime's %Y writes year 999 as "999", which sorts after "2026")."""
    utc = moment.astimezone(timezone.utc)
    return f"{utc.year:04d}-" + utc.strftime("%m-%dT%H:%M:%S.%fZ")
