"""The PAMSPEC error codes (section 14) and which of them a client may retry: the service and the SDK share them.

Pure: no I/O. The server's error types (schemas.errors) and the SDK's PamspecError both read these.
"""

from __future__ import annotations

from typing import Literal

ErrorCode = Literal[
    "invalid_request",
    "invalid_object",
    "unsupported_object_type",
    "object_not_found",
    "scope_not_found",
    "access_denied",
    "policy_denied",
    "version_conflict",
    "duplicate_operation",
    "invalid_state_transition",
    "relationship_conflict",
    "embedding_space_mismatch",
    "snapshot_not_found",
    "retention_restriction",
    "legal_hold",
    "object_redacted",
    "object_deleted",
    "service_unavailable",
    "internal_error",
]

ERROR_CODES: tuple[str, ...] = ErrorCode.__args__  # type: ignore[attr-defined]

# Retryable per the section 14 table: only "Yes" counts as retryable; "Maybe" codes are not retried blindly.
RETRYABLE: dict[str, bool] = {code: code in ("version_conflict", "service_unavailable") for code in ERROR_CODES}
