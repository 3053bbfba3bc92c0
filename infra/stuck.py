"""A stream follower's stuck state: the event it cannot apply, why, since when, how often, and when to retry.

Why: a follower must never skip an event (replay must stay equal) nor wedge silently (invariant 12). It
retries the event with capped exponential backoff, logs once per change of this state (not per retry),
and shows it in its status reply. Pure: times arrive as inputs, so any follower (projector, indexer,
gateway) can hold one.
"""

from __future__ import annotations

import traceback
from dataclasses import dataclass
from datetime import datetime
from typing import Any

REASON_CHARS = 300  # a reason names the error class and the first line of its message, no more


@dataclass(frozen=True)
class Stuck:
    """Where a follower stands still: the ledger sequence it cannot apply and why."""

    sequence: int
    reason: str
    since: datetime
    attempts: int

    def report(self) -> dict[str, Any]:
        return {"sequence": self.sequence, "reason": self.reason,
                "since": self.since.isoformat().replace("+00:00", "Z"), "attempts": self.attempts}


class StuckState:
    """Failures at one sequence and the backoff before the next attempt (first_delay doubling, capped)."""

    def __init__(self, first_delay: float, max_delay: float):
        self.first_delay = first_delay
        self.max_delay = max_delay
        self.current: Stuck | None = None

    def failed(self, sequence: int, reason: str, now: datetime) -> bool:
        """Count a failed attempt at `sequence`; True when this changes the state (a new sequence or reason),
        which is when the follower logs it."""
        previous = self.current
        if previous is not None and previous.sequence == sequence:
            self.current = Stuck(sequence, reason, previous.since, previous.attempts + 1)
            return previous.reason != reason
        self.current = Stuck(sequence, reason, now, 1)
        return True

    def passed(self, applied: int) -> Stuck | None:
        """The follower applied through `applied`: returns the stuck state it left (then cleared), if any."""
        previous = self.current
        if previous is None or applied < previous.sequence:
            return None
        self.current = None
        return previous

    def delay(self) -> float:
        """Seconds to wait before the next attempt: 0 when not stuck."""
        if self.current is None:
            return 0.0
        return min(self.max_delay, self.first_delay * 2.0 ** min(self.current.attempts - 1, 32))

    def report(self) -> dict[str, Any] | None:
        """The status reply's `stuck` member: null while the follower moves."""
        return self.current.report() if self.current is not None else None


def describe(exc: BaseException) -> str:
    """A one-line reason: the error class and the first line of its message (Postgres adds context lines).
    Database and decoder messages name the problem, not the memory content."""
    lines = str(exc).strip().splitlines()
    text = f"{type(exc).__name__}: {lines[0]}" if lines else type(exc).__name__
    return text[:REASON_CHARS]


_CAUSE = "\n\nThe above exception was the direct cause of the following exception:\n\n"
_CONTEXT = "\n\nDuring handling of the above exception, another exception occurred:\n\n"


def traceback_text(exc: BaseException) -> str:
    """The traceback of `exc` (and of its causes, as Python chains them), each ending in `describe`: where
    it failed, without the lines after a message's first (Postgres' DETAIL and CONTEXT quote the data,
    e.g. the JSON it could not take or the row a constraint refused). Every log record's exception is
    rendered so (infra.logging), so the unit of redaction is the same on every path."""
    blocks: list[str] = []
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        blocks.append("Traceback (most recent call last):\n"
                      + "".join(traceback.format_tb(current.__traceback__)) + describe(current))
        if current.__cause__ is not None:
            blocks.append(_CAUSE)
            current = current.__cause__
        elif current.__context__ is not None and not current.__suppress_context__:
            blocks.append(_CONTEXT)
            current = current.__context__
        else:
            current = None
    if len(blocks) % 2 == 0:  # a cycle ended the chain after a link: drop the dangling link
        blocks.pop()
    return "".join(reversed(blocks))
