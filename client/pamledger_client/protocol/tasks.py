"""Small asyncio helpers shared by the long-running loops."""

from __future__ import annotations

import asyncio
from typing import Any


def reraise_if_cancelled() -> None:
    """nats-py may turn a cancellation into its own error or a timeout; never let that swallow a shutdown."""
    task = asyncio.current_task()
    if task is not None and task.cancelling():
        raise asyncio.CancelledError


async def stop_task(task: asyncio.Task[Any], patience: float = 0.25, attempts: int | None = None,
                    ) -> BaseException | None:
    """Cancel `task` and wait until it has ended, cancelling again while it runs on: Python 3.11's
    `asyncio.wait_for` (which nats-py uses to wait for messages) drops a cancel that races a result, and a
    task that outlives its cancel would run beside its successor. `attempts` bounds the waiting (None:
    until it ends). Returns the exception the task ended with, if any, so it is never left unretrieved."""
    tries = 0
    while not task.done() and (attempts is None or tries < attempts):
        task.cancel()
        tries += 1
        await asyncio.wait({task}, timeout=patience)
    if task.done() and not task.cancelled():
        return task.exception()
    return None
