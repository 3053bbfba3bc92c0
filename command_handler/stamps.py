"""Ids and the commit clock for a command (the writer shell's job, never the core's)."""

from __future__ import annotations

import os
from datetime import datetime, timezone

from command_handler.core.ids import stamp_from, uuid4_text
from command_handler.core.intake import Parsed
from command_handler.core.state import Stamp

__all__ = ["new_stamp", "uuid4_text"]


def new_stamp(parsed: Parsed) -> Stamp:
    """Fresh ids and the commit clock for one command (the shell's job, never the core's). One read of
    the system's randomness gives the four version-4 UUIDs and the content salt."""
    return stamp_from(parsed, os.urandom, datetime.now(timezone.utc))
