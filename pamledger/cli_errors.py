"""Any exception a `pamledger` command raises, as the PAMSPEC error envelope: one format for every failure.

Why one place: the commands reach the settings, NATS, Postgres and the local servers, each with exceptions
of its own; a user sees the same envelope on stderr for all of them, and an unexpected one is an
internal_error whose traceback is logged only at PAMLEDGER_LOG_LEVEL=debug. The server's own exceptions are
mapped here; what a client command can raise, by the client CLI's mapping (pamledger_client.cli_errors).
"""

from __future__ import annotations

from typing import Any

import psycopg
import pydantic
import structlog

from infra.endpoints import NoServers
from pamledger_client.cli_errors import as_pamspec as as_client_pamspec, first_line as _first_line
from pamledger_client.errors import PamspecError
from schemas.errors import PamledgerError

log = structlog.get_logger("pamledger.cli")


def as_pamspec(exc: Exception, state_dir: str | None = None) -> PamspecError:
    """The envelope for exc (pure: no I/O). Order matters: RecursionError is a RuntimeError."""
    match exc:
        case PamledgerError():
            return PamspecError.of(exc.code, exc.message, exc.details)
        case NoServers():
            return PamspecError.of("service_unavailable", str(exc), {"state_dir": state_dir})
        case pydantic.ValidationError():
            return _bad_settings(exc)
        case psycopg.OperationalError():
            return PamspecError.of("service_unavailable", f"cannot reach Postgres: {_first_line(exc)}")
        case RecursionError():
            return as_client_pamspec(exc)
        case RuntimeError():  # the local servers' own failures (stores held, servers that would not stop)
            return PamspecError.of("service_unavailable", _first_line(exc), {"state_dir": state_dir})
    return as_client_pamspec(exc)


def failed(exc: Exception, state_dir: str | None, logging_ready: bool, serving: bool = False) -> PamspecError:
    """The envelope for exc; its traceback goes to the log at debug level (once logging is configured:
    before that, the settings that choose the level could not be read). A serving process (`run`, `serve`)
    that dies of an unexpected error logs it at any level: it is a service's crash record."""
    error = as_pamspec(exc, state_dir)
    if logging_ready and serving and error.code == "internal_error":
        log.critical("process.crashed", exc_info=exc)
    elif logging_ready:
        log.debug("command.failed", exc_info=exc)
    return error


def _bad_settings(exc: pydantic.ValidationError) -> PamspecError:
    """Name each bad setting as its environment variable; the value itself is left out (it may be a secret)."""
    problems: list[dict[str, Any]] = [
        {"setting": "PAMLEDGER_" + "__".join(str(part) for part in error["loc"]).upper(), "error": error["msg"]}
        for error in exc.errors()]
    listed = "; ".join(f"{p['setting']}: {p['error']}" for p in problems)
    return PamspecError.of("invalid_request", f"invalid settings: {listed}", {"settings": problems})
