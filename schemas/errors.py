"""The PAMSPEC error envelope (section 14), its 19 stable codes, and the service's error hierarchy.

One root error type; below it: rejected (a reply, done), conflict (retryable), unavailable (retry with
backoff) and poison (undecodable input). Every error a client can see becomes an ErrorEnvelope.
"""

from __future__ import annotations

from typing import Any

import msgspec

# The codes live in the protocol (the SDK reads them too); the server names them here as well.
from pamledger_client.protocol.errors import ERROR_CODES as ERROR_CODES, RETRYABLE as RETRYABLE, ErrorCode as ErrorCode


class ErrorEnvelope(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """What a client sees for any failure."""

    code: ErrorCode
    message: str
    retryable: bool
    operation_id: str
    details: dict[str, Any] = msgspec.field(default_factory=dict)
    policy_rule_id: str | None = None
    correlation_id: str | None = None


class PamledgerError(Exception):
    """Root of every error the service raises on purpose; carries a stable PAMSPEC code."""

    code: ErrorCode = "internal_error"

    def __init__(self, message: str, *, details: dict[str, Any] | None = None, code: ErrorCode | None = None):
        super().__init__(message)
        self.message = message
        self.details = details or {}
        if code is not None:
            self.code = code

    @property
    def retryable(self) -> bool:
        return RETRYABLE[self.code]

    def envelope(self, operation_id: str) -> ErrorEnvelope:
        return ErrorEnvelope(
            code=self.code,
            message=self.message,
            retryable=self.retryable,
            operation_id=operation_id,
            details=self.details,
        )


class CommandRejected(PamledgerError):
    """The command is answered with an error and nothing is written."""

    code: ErrorCode = "invalid_request"


class InvalidRequest(CommandRejected):
    code: ErrorCode = "invalid_request"


class InvalidObject(CommandRejected):
    code: ErrorCode = "invalid_object"


class ObjectNotFound(CommandRejected):
    code: ErrorCode = "object_not_found"


class ScopeNotFound(CommandRejected):
    code: ErrorCode = "scope_not_found"


class SnapshotNotFound(CommandRejected):
    code: ErrorCode = "snapshot_not_found"


class VersionConflict(CommandRejected):
    code: ErrorCode = "version_conflict"


class DuplicateOperation(CommandRejected):
    code: ErrorCode = "duplicate_operation"


class InvalidStateTransition(CommandRejected):
    code: ErrorCode = "invalid_state_transition"


class LegalHold(CommandRejected):
    code: ErrorCode = "legal_hold"


class ObjectDeleted(CommandRejected):
    code: ErrorCode = "object_deleted"


class ObjectRedacted(CommandRejected):
    code: ErrorCode = "object_redacted"


class ServiceUnavailable(PamledgerError):
    """Infrastructure trouble: the client may retry with backoff."""

    code: ErrorCode = "service_unavailable"


class AccessDenied(PamledgerError):
    """A policy refused the request (access_denied or policy_denied), naming the rule that decided."""

    code: ErrorCode = "access_denied"

    def __init__(self, message: str, *, rule_id: str, code: ErrorCode | None = None):
        super().__init__(message, code=code)
        self.rule_id = rule_id

    def envelope(self, operation_id: str) -> ErrorEnvelope:
        return msgspec.structs.replace(super().envelope(operation_id), policy_rule_id=self.rule_id)
