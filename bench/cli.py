"""What the benchmarks' `main` functions share: logging, interrupts that clean up, and a steps option."""

from __future__ import annotations

import os
import signal
import sys
from collections.abc import Callable
from typing import Any

from infra.logging import configure_logging


def parse_steps(text: str, allowed: tuple[str, ...], flag: str) -> tuple[str, ...]:
    """A comma-separated subset of a benchmark's steps, in the order given; anything else stops the run."""
    chosen = tuple(x.strip() for x in text.split(",") if x.strip())
    if not chosen or set(chosen) - set(allowed):
        raise SystemExit(f"{flag}: choose from {','.join(allowed)}")
    return chosen


def _terminate(signum: int, frame: Any) -> None:
    """SIGTERM takes the Ctrl-C path: inside asyncio.run that cancels the benchmark, whose cleanup then runs."""
    handler = signal.getsignal(signal.SIGINT)
    if callable(handler):
        handler(signal.SIGINT, frame)
    else:
        raise KeyboardInterrupt


def interruptible(run: Callable[[], int]) -> int:
    """Run a benchmark with console logs and Ctrl-C or SIGTERM stopping its services and servers (exit 130).

    Logs at PAMLEDGER_BENCH_LOG_LEVEL (default warning), so the services' own output stays in their log files.
    """
    configure_logging("console", os.environ.get("PAMLEDGER_BENCH_LOG_LEVEL", "warning"))
    signal.signal(signal.SIGINT, signal.default_int_handler)  # even if started with SIGINT ignored
    signal.signal(signal.SIGTERM, _terminate)
    try:
        return run()
    except KeyboardInterrupt:
        print("bench: interrupted; services and servers stopped", file=sys.stderr)
        return 130
