"""The one place that maps psycopg errors to the service's own errors."""

from __future__ import annotations

import psycopg

from schemas.errors import PamledgerError, ServiceUnavailable


def map_db_error(exc: BaseException) -> PamledgerError:
    """Connection trouble and serialization failures are retryable; anything else is internal_error."""
    if isinstance(exc, (psycopg.OperationalError, psycopg.errors.SerializationFailure, psycopg.errors.LockNotAvailable)):
        return ServiceUnavailable("database unavailable; retry with backoff", details={"reason": type(exc).__name__})
    return PamledgerError("internal error while talking to the database", details={"reason": type(exc).__name__})
