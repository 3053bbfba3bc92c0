"""structlog set-up, once per entrypoint: JSON in production, console in a terminal; logs go to stderr."""

from __future__ import annotations

import logging
import sys

import structlog


def configure_logging(fmt: str = "auto", level: str = "info") -> None:
    """fmt is 'json', 'console' or 'auto' (console when stderr is a terminal)."""
    use_console = fmt == "console" or (fmt == "auto" and sys.stderr.isatty())
    renderer: structlog.typing.Processor = (
        structlog.dev.ConsoleRenderer() if use_console else structlog.processors.JSONRenderer()
    )
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(logging.getLevelName(level.upper())),
        logger_factory=structlog.PrintLoggerFactory(file=sys.stderr),
        cache_logger_on_first_use=True,
    )
