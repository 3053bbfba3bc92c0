"""Any exception a client command raises, as the PAMSPEC error envelope: one format for every failure.

Why one place: the commands reach the environment, NATS and the service, each with exceptions of its own; a
user sees the same envelope on stderr for all of them, and an unexpected one is an internal_error whose
traceback is logged only at PAMLEDGER_LOG_LEVEL=debug. The server's CLI (pamledger.cli_errors) puts the
server's own exceptions (settings, Postgres, local servers) in front of these.
"""

from __future__ import annotations

import logging

import nats.errors

from pamledger_client.errors import PamspecError

log = logging.getLogger("pamledger_client.cli")


def as_pamspec(exc: Exception) -> PamspecError:
    """The envelope for exc (pure: no I/O). Order matters: RecursionError is a RuntimeError."""
    match exc:
        case PamspecError():
            return exc
        case nats.errors.Error():
            return PamspecError.of("service_unavailable", f"NATS: {first_line(exc)}")
        case TimeoutError():
            return PamspecError.of("service_unavailable", f"timed out: {first_line(exc)}")
        case RecursionError():
            return PamspecError.of("invalid_request", "input nests too deeply to process")
    return PamspecError.of("internal_error", f"unexpected {type(exc).__name__}: {first_line(exc)} "
                           "(PAMLEDGER_LOG_LEVEL=debug logs the traceback)")


def failed(exc: Exception) -> PamspecError:
    """The envelope for exc; its traceback goes to the log at debug level."""
    log.debug("command failed", exc_info=exc)
    return as_pamspec(exc)


def first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__
