"""One style of progress for long work (export, import, backup, restore, replay, audit, verify, index rebuild,
scrub): a bar with rate and ETA redrawn in place on a terminal, JSON lines (`{"progress": {...}}`) when stderr
is not one, nothing with --quiet. stdout keeps the command's one JSON result either way.

An update is a dict; where it names how far the work is (`done_key`) and how far it goes (`total_key`), the
terminal shows a bar, a rate and an ETA; otherwise its fields. Pure apart from the stream it writes to.
"""

from __future__ import annotations

import json
import sys
import time
from typing import Any, TextIO

BAR_WIDTH = 28
REDRAW_SECONDS = 0.2


def _duration(seconds: float) -> str:
    seconds = int(seconds)
    return f"{seconds // 3600}:{seconds // 60 % 60:02d}:{seconds % 60:02d}" if seconds >= 3600 \
        else f"{seconds // 60}:{seconds % 60:02d}"


class ProgressReporter:
    """Called with each update (a dict); `finish()` ends a terminal's bar with a newline."""

    def __init__(self, task: str, done_key: str | None = None, total_key: str | None = None, quiet: bool = False,
                 stream: TextIO | None = None, tty: bool | None = None, unit: str = ""):
        self.task, self.done_key, self.total_key, self.quiet, self.unit = task, done_key, total_key, quiet, unit
        self.stream = stream if stream is not None else sys.stderr
        self.tty = self.stream.isatty() if tty is None else tty
        self.started = time.monotonic()
        self.first: tuple[float, float] | None = None  # (time, done) of the first update: the rate's origin
        self.drawn = 0.0
        self.line = ""

    def __call__(self, update: dict[str, Any]) -> None:
        if self.quiet:
            return
        if not self.tty:
            print(json.dumps({"progress": update}, sort_keys=True, default=str), file=self.stream, flush=True)
            return
        now = time.monotonic()
        self.line = self.render(update, now)
        if now - self.drawn >= REDRAW_SECONDS:
            self.drawn = now
            print("\r\x1b[K" + self.line, end="", file=self.stream, flush=True)

    def render(self, update: dict[str, Any], now: float) -> str:
        """The terminal line for one update."""
        done = update.get(self.done_key) if self.done_key else None
        total = update.get(self.total_key) if self.total_key else None
        if not isinstance(done, (int, float)) or not isinstance(total, (int, float)) or total <= 0:
            fields = " ".join(f"{k}={v}" for k, v in update.items())
            return f"{self.task}: {fields} ({_duration(now - self.started)})"
        if self.first is None:
            self.first = (now, float(done))
        elapsed = now - self.first[0]
        rate = (done - self.first[1]) / elapsed if elapsed > 0 else 0.0
        fraction = min(1.0, max(0.0, done / total))
        filled = int(BAR_WIDTH * fraction)
        eta = f"ETA {_duration((total - done) / rate)}" if rate > 0 and total > done else f"{_duration(now - self.started)}"
        unit = f" {self.unit}" if self.unit else ""
        return (f"{self.task} [{'#' * filled}{'.' * (BAR_WIDTH - filled)}] {fraction:4.0%} {done:,}/{total:,}{unit}"
                f" {rate:,.0f}/s {eta}")

    def note(self, text: str) -> None:
        """A sentence rather than a state (waiting for another process, a warning)."""
        if self.quiet:
            return
        if self.tty:
            print("\r\x1b[K" + text, file=self.stream, flush=True)
        else:
            print(json.dumps({"progress": {"note": text}}, sort_keys=True), file=self.stream, flush=True)

    def finish(self) -> None:
        if self.tty and self.line and not self.quiet:
            print("\r\x1b[K" + self.line, file=self.stream, flush=True)
            self.line = ""
