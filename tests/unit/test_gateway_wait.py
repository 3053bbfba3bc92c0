"""A delivery pump must die when cancelled, even if its wake-up lands at the same moment: `resume` and
`close` wait for the old pump to end before they start a new one."""

from __future__ import annotations

import asyncio
import types

import pytest

from subscriptions.pump import wait


async def test_a_cancel_that_races_the_wake_up_still_cancels_the_wait() -> None:
    session = types.SimpleNamespace(wake=asyncio.Event())
    waiting = asyncio.create_task(wait(session, 30.0))  # type: ignore[arg-type]
    await asyncio.sleep(0)  # the task is now parked on the event
    session.wake.set()  # its wake-up is scheduled ...
    waiting.cancel()  # ... and the cancel lands in the same loop iteration
    with pytest.raises(asyncio.CancelledError):
        await waiting


async def test_stopping_a_task_that_swallows_a_cancel_cancels_it_again_until_it_ends() -> None:
    from pamledger_client.protocol.tasks import stop_task

    swallowed = 0

    async def stubborn() -> None:
        nonlocal swallowed
        while True:
            try:
                await asyncio.sleep(10)
            except asyncio.CancelledError:
                if swallowed == 0:  # what a racing wait_for does to the first cancel
                    swallowed += 1
                    asyncio.current_task().uncancel()  # type: ignore[union-attr]
                    continue
                raise

    task = asyncio.create_task(stubborn())
    await asyncio.sleep(0)
    await asyncio.wait_for(stop_task(task, patience=0.05), 5)
    assert task.cancelled() and swallowed == 1
