"""Process plumbing the local servers and the supervisor share: dying with the parent, watching a server.

Why in the kernel: local_servers.launch hands the supervisor (composition root) one watch per server it
started, and a child must not outlive a SIGKILLed parent whoever spawned it (supervisor, bench).
"""

from __future__ import annotations

import ctypes
import signal
from collections.abc import Callable
from dataclasses import dataclass

_PR_SET_PDEATHSIG = 1


def die_with_parent() -> None:
    """Runs in a child between fork and exec: ask the kernel for SIGTERM when the parent dies."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)


@dataclass
class ServerWatch:
    """A server `run` started: `alive` is asked every poll, `revive` brings it back in place."""

    name: str
    alive: Callable[[], bool]
    revive: Callable[[], None]
    down_since: float | None = None
    attempts: int = 0
    not_before: float = 0.0
    last_error: str | None = None
