"""How a role's restart loop reports failures: the traceback once per distinct reason, one line per change.

Why: a role that cannot reach Postgres, or that hits the same bug on every restart, logged a warning or a
full traceback on every attempt, every 0.5 s (an outage of minutes filled megabytes of log). The loop now
waits with capped backoff, logs when the reason changes (with the traceback for an unexpected error, none
for a lost database) and once when the role serves again.

"Serves again" means it has run for `healthy_seconds` without failing, not that it took its lock: a role
that failed right after the lock (a Subscribe row it cannot read, a statement Postgres refuses every time)
was counted as recovered on every attempt, so it retried every 0.5 s with a traceback each time.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterator

import structlog

from infra.stuck import describe

log = structlog.get_logger(__name__)


class RoleFailures:
    """One role's run of failures: the reason last logged, how many in a row, and the wait before retrying."""

    def __init__(self, role: str, first_delay: float, max_delay: float, healthy_seconds: float = 30.0):
        self.role = role
        self.first_delay = first_delay
        self.max_delay = max_delay
        self.healthy_seconds = healthy_seconds
        self.reason: str | None = None
        self.attempts = 0

    def failed(self, exc: BaseException, expected: bool) -> float:
        """Count a failure, log it if its reason is new, and return the seconds to wait before retrying.
        `expected` failures (a lost database) log one line; others log their traceback."""
        reason = describe(exc)
        self.attempts += 1
        if reason != self.reason:
            self.reason = reason
            if expected:
                log.warning(f"{self.role}.lost_database", reason=reason, attempts=self.attempts)
            else:
                log.error(f"{self.role}.crashed", reason=reason, attempts=self.attempts, exc_info=exc)
        return min(self.max_delay, self.first_delay * 2.0 ** min(self.attempts - 1, 16))

    @contextlib.contextmanager
    def running(self) -> Iterator[None]:
        """Around one run of the role (from taking its lock): if it lasts `healthy_seconds`, the role
        serves again (`serving`); a run that fails sooner keeps counting failures and backing off."""
        handle = asyncio.get_running_loop().call_later(self.healthy_seconds, self.serving)
        try:
            yield
        finally:
            handle.cancel()

    def serving(self) -> None:
        """The role reached its serving state again: say so once and start the backoff afresh."""
        if self.attempts:
            log.info(f"{self.role}.recovered", after_attempts=self.attempts, last_reason=self.reason)
        self.reason, self.attempts = None, 0
