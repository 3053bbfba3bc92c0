"""structlog set-up, once per entrypoint: JSON in production, console in a terminal; logs go to stderr.

Why one renderer for everything: a JSON log must be JSON on every line, so the records of libraries that
log through the standard library (psycopg, nats, asyncio) go through the same processors as our own, and
exceptions are rendered (a traceback string under `exception`), never left as `"exc_info": true`.
Every exception, on every path and in every format, is rendered by one redacting function
(infra.stuck.traceback_text): each message is cut to its first line, since Postgres' DETAIL and CONTEXT
lines ("Failing row contains (...)") quote the data and memory content never goes into a log.
"""

from __future__ import annotations

import logging
import sys
from types import TracebackType
from typing import Any

import structlog

from infra.stuck import traceback_text

_SHARED: list[structlog.typing.Processor] = [
    structlog.contextvars.merge_contextvars,
    structlog.processors.add_log_level,
    structlog.processors.TimeStamper(fmt="iso", utc=True),
]


def configure_logging(fmt: str = "auto", level: str = "info") -> None:
    """fmt is 'json', 'console' or 'auto' (console when stderr is a terminal)."""
    use_console = fmt == "console" or (fmt == "auto" and sys.stderr.isatty())
    renderer: structlog.typing.Processor = (
        structlog.dev.ConsoleRenderer() if use_console else structlog.processors.JSONRenderer()
    )
    # Both renderers get exceptions as redacted text (the console one prints an `exception` string as is).
    tracebacks: list[structlog.typing.Processor] = [redact_exc_info]
    numeric_level = logging.getLevelName(level.upper())
    structlog.configure(
        processors=[*_SHARED, *tracebacks, renderer],
        wrapper_class=structlog.make_filtering_bound_logger(numeric_level),
        logger_factory=structlog.PrintLoggerFactory(file=sys.stderr),
        cache_logger_on_first_use=True,
    )
    _route_stdlib(renderer, tracebacks, numeric_level)
    sys.excepthook = _log_uncaught


def redact_exc_info(logger: Any, name: str, event_dict: structlog.typing.EventDict) -> structlog.typing.EventDict:
    """A structlog processor: `exc_info` (an exception, a sys.exc_info() tuple, or True for the one being
    handled) becomes `exception`, its traceback with every message cut to its first line."""
    exc_info = event_dict.pop("exc_info", None)
    if exc_info is True:
        exc_info = sys.exc_info()
    exc = exc_info[1] if isinstance(exc_info, tuple) else exc_info
    if isinstance(exc, BaseException):
        event_dict["exception"] = traceback_text(exc)
    return event_dict


def _log_uncaught(kind: type[BaseException], value: BaseException, tb: TracebackType | None) -> None:
    """An exception that ends the process is a log record too (Python would print a bare traceback)."""
    if issubclass(kind, KeyboardInterrupt):
        sys.__excepthook__(kind, value, tb)
        return
    structlog.get_logger("pamledger").critical("process.crashed", exc_info=(kind, value, tb))


def _route_stdlib(renderer: structlog.typing.Processor, tracebacks: list[structlog.typing.Processor],
                  level: int) -> None:
    """Send the standard library's records (psycopg, nats, asyncio, ...) through the same renderer, with the
    logger's name, to stderr: one root handler replaces whatever was there."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(structlog.stdlib.ProcessorFormatter(
        foreign_pre_chain=[*_SHARED, structlog.stdlib.add_logger_name],
        processors=[structlog.stdlib.ProcessorFormatter.remove_processors_meta, *tracebacks, renderer],
    ))
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level)
    logging.captureWarnings(True)
