"""Small asyncio helpers shared by the long-running loops."""

from __future__ import annotations

import asyncio


def reraise_if_cancelled() -> None:
    """nats-py may turn a cancellation into its own error or a timeout; never let that swallow a shutdown."""
    task = asyncio.current_task()
    if task is not None and task.cancelling():
        raise asyncio.CancelledError
