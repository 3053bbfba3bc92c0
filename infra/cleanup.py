"""Cleanup that a repeated cancel cannot cut short.

Why: a role is stopped with `stop_task`, which cancels again every fraction of a second until the task ends
(pamledger_client.protocol.tasks), and a task waiting in `asyncio.gather` is cancelled once more with every
such cancel. A cancel that lands inside a `finally` skips the rest of it: a gateway's flusher left running
would reconnect and take its partition's lock again after the role stopped, so no other process could lead.
"""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any


async def run_to_end(cleanup: Coroutine[Any, Any, None]) -> None:
    """Await `cleanup` to its end in a task of its own; a cancel that arrives meanwhile is raised after it."""
    task = asyncio.create_task(cleanup)
    cancelled = False
    while not task.done():
        try:
            await asyncio.shield(task)
        except asyncio.CancelledError:
            if task.done() and task.cancelled():
                raise
            cancelled = True
    task.result()
    if cancelled:
        raise asyncio.CancelledError
