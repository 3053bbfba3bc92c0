"""PAMSPEC-Delegation on the wire: the grant, check and revoke commands, and the Delegation Object they record.

A grant binds a granting actor to a delegated actor over PAMSPEC operations in one scope, for a window,
under a policy basis, optionally for some objects or object types and a number of uses. The writer records
it as a `delegation_granted` entry whose payload is the Delegation Object (delegation.schema.json); a
check that passes is a use, recorded as `delegation_exercised` and counted exactly (one writer); a revoke
is `delegation_revoked`. The rules live in command_handler/core/delegations.py.
"""

from __future__ import annotations

from typing import Annotated, Any

import msgspec

from schemas.auth import Operation
from schemas.common import (
    COMMAND_STRUCT,
    Id,
    IdempotencyKey,
    ObjectType,
    Timestamp,
)
from schemas.envelope import Actor

PolicyBasis = Annotated[str, msgspec.Meta(min_length=1, max_length=1024)]
DELEGATION_SPEC_VERSION = "0.1.0-draft"


class GrantDelegation(msgspec.Struct, tag="grant_delegation", **COMMAND_STRUCT):
    """Record a delegation. `actor` records it: the granting actor itself, or an administrator."""

    scope_id: Id
    granting_actor: Actor
    delegated_actor: Actor
    granted_operations: Annotated[list[Operation], msgspec.Meta(min_length=1, max_length=12)]
    policy_basis: PolicyBasis
    not_before: Timestamp
    not_after: Timestamp
    actor: Actor
    delegation_id: Id | None = None  # minted (`del:<uuid>`) when absent
    usage_limit: Annotated[int, msgspec.Meta(ge=1, le=2**31 - 1)] | None = None
    granted_object_ids: Annotated[list[Id], msgspec.Meta(min_length=1, max_length=1000)] | None = None
    granted_object_types: Annotated[list[ObjectType], msgspec.Meta(min_length=1, max_length=100)] | None = None
    target_scope_id: Id | None = None
    revocable: bool = True
    operation_id: Id | None = None
    idempotency_key: IdempotencyKey | None = None


class CheckDelegation(msgspec.Struct, tag="check_delegation", **COMMAND_STRUCT):
    """Exercise a delegation once: the grant when it allows `operation` (a use, counted), else access_denied."""

    scope_id: Id
    delegation_id: Id
    delegated_actor_id: Id
    operation: Operation
    actor: Actor
    object_id: Id | None = None
    object_type: ObjectType | None = None
    on_behalf_of_actor_id: Id | None = None  # when given, must be the granting actor
    # The service's own checks for reads under a delegation: `whole_scope` (a query or search) is refused by a
    # delegation restricted to some objects or types; `strict` refuses a type restriction it cannot verify.
    whole_scope: bool = False
    strict: bool = False
    operation_id: Id | None = None
    idempotency_key: IdempotencyKey | None = None


class RevokeDelegation(msgspec.Struct, tag="revoke_delegation", **COMMAND_STRUCT):
    """End a delegation at once (by its granting actor or an administrator)."""

    scope_id: Id
    delegation_id: Id
    actor: Actor
    reason: Annotated[str, msgspec.Meta(max_length=256)] = "revoked"
    operation_id: Id | None = None
    idempotency_key: IdempotencyKey | None = None


DelegationCommand = GrantDelegation | CheckDelegation | RevokeDelegation


class DelegationState(msgspec.Struct, frozen=True, kw_only=True):
    """What the writer knows of one delegation: the recorded Delegation Object, its uses and whether revoked."""

    delegation_id: str
    scope_id: str
    grant: dict[str, Any]  # the Delegation Object, as delegation.schema.json
    uses: int = 0
    revoked: bool = False
