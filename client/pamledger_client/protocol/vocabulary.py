"""The wire vocabulary the service and its clients share: identifiers, the four state dimensions, the query
and search options, relationship types, the system scope's record types. Pure: no I/O.

Why in the client distribution: an agent's environment holds only pamledger-client, and its CLI offers these
as choices before anything is sent; the server (schemas/) reads the same names from here, so the two cannot
drift apart.
"""

from __future__ import annotations

import re
from datetime import datetime, timezone
from typing import Literal

# Patterns end in `\Z`, never `$`: `$` also matches before a final newline, so `workspace:x\n` would pass
# as an id of its own (msgspec applies patterns with re.search).
ID_PATTERN = r"^[A-Za-z][A-Za-z0-9+.\-]*:[A-Za-z0-9+._:\-/]+\Z"
_ID = re.compile(ID_PATTERN)
# The scope of the service's own ledger entries (actors, credentials, space registrations): migration 008.
SYSTEM_SCOPE = "system:pamledger"

LifecycleState = Literal["scratch", "candidate", "active", "superseded", "deprecated", "archived"]
AvailabilityState = Literal["available", "partially_redacted", "redacted", "deleted"]
RetentionState = Literal["retained", "expired", "pending_deletion", "legal_hold"]
ValidationState = Literal["unverified", "corroborated", "disputed", "rejected"]
Dimension = Literal["lifecycle", "availability", "retention", "validation"]

DIMENSION_STATES: dict[str, frozenset[str]] = {
    "lifecycle": frozenset(LifecycleState.__args__),  # type: ignore[attr-defined]
    "availability": frozenset(AvailabilityState.__args__),  # type: ignore[attr-defined]
    "retention": frozenset(RetentionState.__args__),  # type: ignore[attr-defined]
    "validation": frozenset(ValidationState.__args__),  # type: ignore[attr-defined]
}
# What Query and Search return when a request names no states: PAMSPEC's trusted retrieval target.
TRUSTED_STATES: dict[str, tuple[str, ...]] = {
    "lifecycle": ("active",), "availability": ("available",), "retention": ("retained",),
    "validation": ("corroborated",),
}

TimeField = Literal["observed_at", "asserted_at", "valid_from", "valid_until", "committed_at", "recorded_at"]
TIME_FIELDS: tuple[str, ...] = TimeField.__args__  # type: ignore[attr-defined]
Order = Literal[
    "newest", "oldest", "score",
    "observed_at_desc", "observed_at_asc", "asserted_at_desc", "asserted_at_asc",
    "valid_from_desc", "valid_from_asc", "valid_until_desc", "valid_until_asc",
    "committed_at_desc", "committed_at_asc", "recorded_at_desc", "recorded_at_asc",
    "assessed_confidence_desc", "assessed_confidence_asc", "contradiction_score_desc", "contradiction_score_asc",
    "staleness_score_desc", "staleness_score_asc", "evidence_strength_desc", "evidence_strength_asc",
    "source_diversity_desc", "source_diversity_asc",
]
ORDERS: tuple[str, ...] = Order.__args__  # type: ignore[attr-defined]
QUERY_MAX_LIMIT = 500
MAX_HOPS = 3  # related: relationship hops

SearchMode = Literal["hybrid", "semantic", "lexical"]
MODES: tuple[str, ...] = SearchMode.__args__  # type: ignore[attr-defined]
SEARCH_MAX_LIMIT = 100

Directionality = Literal["directed", "bidirectional", "undirected"]
DIRECTIONALITIES: tuple[str, ...] = Directionality.__args__  # type: ignore[attr-defined]
# The short, well-known relationship labels (8.5 and 8.2, plus derived_from, the link Promote creates). Each says
# whether an object may relate to itself by it: none of these may (a claim does not support itself); extension
# types (reverse-DNS or URI) are the relating agent's own vocabulary and are kept as sent, self-loops included.
RELATIONSHIP_VOCABULARY: dict[str, bool] = {
    "supports": False,
    "contradicts": False,
    "derives_from": False,
    "derived_from": False,
    "references": False,
    "supersedes": False,
    "part_of": False,
    "informed_by": False,
    "produced_by": False,
}

# Who may call: actors and credentials are objects of the system scope (server: schemas.auth).
ACTOR_TYPE = "dev.pamledger.actor"
CREDENTIAL_TYPE = "dev.pamledger.credential"
ACTOR_SCHEMA_ID = "urn:pamledger:schema:actor:1"
CREDENTIAL_SCHEMA_ID = "urn:pamledger:schema:credential:1"
ADMIN_ACTOR_ID = "actor:pamledger:admin"
# PAMSPEC's operations (common.schema.json pamspec_operation): what a grant or a delegation names.
Operation = Literal["create", "read", "update", "transition", "relate", "query", "inspect_history", "redact",
                    "delete", "promote", "subscribe", "unsubscribe"]
# A grant's operations: PAMSPEC's, "validate" (pamledger's reviewer operation, grants only) and "*" (all).
GRANT_OPERATIONS: frozenset[str] = frozenset(Operation.__args__) | {"validate", "*"}  # type: ignore[attr-defined]
# A grant's scope: an exact id, a prefix ending in "*", or "*" alone; never NUL or whitespace.
GRANT_SCOPE_PATTERN = r"^[^\s\x00*]{0,511}\*?\Z"


def credential_object_id(token_id: str) -> str:
    return f"credential:{token_id}"


def is_valid_id(value: str) -> bool:
    """True when value follows the PAMSPEC `scheme:rest` identifier pattern."""
    return len(value) <= 512 and _ID.match(value) is not None


def timestamp_text(moment: datetime) -> str:
    """UTC with six fraction digits and a four-digit year: every recorded time has one width, so the texts
    compare as the times do (strftime's %Y writes year 999 as "999", which sorts after "2026")."""
    utc = moment.astimezone(timezone.utc)
    return f"{utc.year:04d}-" + utc.strftime("%m-%dT%H:%M:%S.%fZ")
