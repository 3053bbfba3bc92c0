"""Shared wire vocabulary: identifiers, the four state dimensions, object types, timestamps."""

from __future__ import annotations

import re
from datetime import datetime
from typing import Annotated

import msgspec

# The vocabulary the SDK shares lives in the protocol (pamledger_client.protocol.vocabulary); named here too.
from pamledger_client.protocol.vocabulary import (
    DIMENSION_STATES as DIMENSION_STATES,
    ID_PATTERN as ID_PATTERN,
    SYSTEM_SCOPE as SYSTEM_SCOPE,
    AvailabilityState as AvailabilityState,
    Dimension as Dimension,
    LifecycleState as LifecycleState,
    RetentionState as RetentionState,
    ValidationState as ValidationState,
    is_valid_id as is_valid_id,
    timestamp_text as timestamp_text,
)

EXTENSION_TYPE_PATTERNS = (
    re.compile(r"^[a-z0-9]+(?:\.[a-z0-9-]+)+\.[a-z][a-z0-9-]*\Z"),
    re.compile(r"^[a-z][a-z0-9+.-]*:"),
)
SPEC_VERSION = "0.1.0-draft"

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


STANDARD_OBJECT_TYPES = frozenset(
    {
        "claim", "decision", "task", "artifact", "observation", "entity", "summary",
        "tool_invocation", "tool_result", "working_memory",
    }
)


def is_extension_type(object_type: str) -> bool:
    """True for reverse-DNS or URI object types, which PAMSPEC allows with a schema_id."""
    return any(p.match(object_type) for p in EXTENSION_TYPE_PATTERNS)
