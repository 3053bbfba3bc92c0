"""Who may do what: actors, their grants and their credentials, as Memory Objects of the system scope.

Why objects: an actor's grants and its credentials are authoritative state that must be versioned,
auditable and revocable, which is exactly what a Memory Object in the ledger is. `pamledger actors add`
creates a `dev.pamledger.actor` object (its object_id is the actor_id), `pamledger tokens issue` creates a
`dev.pamledger.credential` object (object_id `credential:<token_id>`) holding only the token's SHA-256
digest, and revoking either deletes the object (its content is erased; the ledger keeps the tombstone).
Inspect History on an actor therefore shows every change of its grants, by whom and when.

Operations are PAMSPEC's (common.schema.json pamspec_operation); "*" in a grant means all of them.
Scope patterns: an exact scope id, a prefix ending in "*" (`workspace:acme:*`), or "*" (every scope except
the system scope, which is only ever granted by its exact id).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Literal

import msgspec

from schemas.common import SYSTEM_SCOPE, Id, Timestamp

# The record types and the header are the protocol's (the SDK registers actors and sends tokens too).
from pamledger_client.protocol.headers import AUTHORIZATION_HEADER as AUTHORIZATION_HEADER
from pamledger_client.protocol.vocabulary import (
    ACTOR_SCHEMA_ID as ACTOR_SCHEMA_ID,
    ACTOR_TYPE as ACTOR_TYPE,
    CREDENTIAL_SCHEMA_ID as CREDENTIAL_SCHEMA_ID,
    CREDENTIAL_TYPE as CREDENTIAL_TYPE,
    GRANT_SCOPE_PATTERN,
    Operation as Operation,
    credential_object_id as credential_object_id,
)

MAX_AUTHORIZATION_CHARS = 256

ALL_OPERATIONS = "*"
# A pamledger extension of PAMSPEC's operations, for actors' grants only (never a delegation's: a review is not
# delegated): setting a validation state other than unverified (command_handler.core.validation).
VALIDATE = "validate"
ALL_SCOPES = "*"

# An exact id, a prefix ending in "*", or "*" alone; never NUL or whitespace.
ScopePattern = Annotated[str, msgspec.Meta(pattern=GRANT_SCOPE_PATTERN, min_length=1, max_length=512)]
TokenId = Annotated[str, msgspec.Meta(pattern=r"^[a-f0-9]{16}\Z")]
TokenDigest = Annotated[str, msgspec.Meta(pattern=r"^sha256:[a-f0-9]{64}\Z")]
# bcrypt of the whole token: the password a NATS server pamledger runs checks (authz/nats_auth.py).
BcryptHash = Annotated[str, msgspec.Meta(pattern=r"^\$2[abxy]\$\d{2}\$[./A-Za-z0-9]{53}\Z")]
ActorKind = Annotated[str, msgspec.Meta(min_length=1, max_length=128)]

_STRICT: dict[str, bool] = dict(frozen=True, kw_only=True, forbid_unknown_fields=True, omit_defaults=True)


class ScopeGrant(msgspec.Struct, **_STRICT):
    """`operations` on every scope one of `scopes` matches."""

    scopes: Annotated[list[ScopePattern], msgspec.Meta(min_length=1, max_length=256)]
    operations: Annotated[list[Operation | Literal["validate", "*"]], msgspec.Meta(min_length=1, max_length=16)]


class ActorRecord(msgspec.Struct, **_STRICT):
    """The content of a `dev.pamledger.actor` object: who the actor is and what it holds."""

    actor_id: Id
    actor_kind: ActorKind
    grants: Annotated[list[ScopeGrant], msgspec.Meta(max_length=256)] = []
    display_name: Annotated[str, msgspec.Meta(max_length=256)] | None = None


class CredentialRecord(msgspec.Struct, **_STRICT):
    """The content of a `dev.pamledger.credential` object: a token's digest (never the token) and its actor."""

    token_id: TokenId
    actor_id: Id
    token_digest: TokenDigest
    not_after: Timestamp | None = None
    label: Annotated[str, msgspec.Meta(max_length=256)] | None = None
    nats_password_hash: BcryptHash | None = None  # absent: the token cannot log in to a NATS pamledger runs


AUTH_CONTENT_SCHEMAS: dict[str, type[msgspec.Struct]] = {ACTOR_TYPE: ActorRecord, CREDENTIAL_TYPE: CredentialRecord}


def scope_matches(pattern: str, scope_id: str) -> bool:
    """Whether a grant's scope pattern covers `scope_id`. The system scope is matched only by its exact id."""
    if pattern == scope_id:
        return True
    if scope_id == SYSTEM_SCOPE:
        return False
    if pattern == ALL_SCOPES:
        return True
    return pattern.endswith("*") and scope_id.startswith(pattern[:-1])


@dataclass(frozen=True)
class Claim:
    """What the request itself says about who acts: the command's actor, or the Pam-Actor header."""

    actor_id: str
    on_behalf_of_actor_id: str | None = None
    delegation_id: str | None = None
    provenance_actor_id: str | None = None  # a write's provenance.actor (bound to the caller: authz.policy)
