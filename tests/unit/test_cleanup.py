"""infra.cleanup: a role's cleanup runs to its end however often the role is cancelled meanwhile."""

from __future__ import annotations

import asyncio

import pytest

from infra.cleanup import run_to_end


async def test_a_repeated_cancel_does_not_cut_cleanup_short_and_is_raised_after_it() -> None:
    steps: list[str] = []
    started, release = asyncio.Event(), asyncio.Event()

    async def cleanup() -> None:
        steps.append("started")
        started.set()
        await release.wait()
        steps.append("finished")

    async def role() -> None:
        try:
            await asyncio.Event().wait()
        finally:
            await run_to_end(cleanup())

    task = asyncio.create_task(role())
    await asyncio.sleep(0)  # the role is waiting
    task.cancel()
    await asyncio.wait_for(started.wait(), timeout=10)
    for _ in range(3):  # what stop_task does while a task runs on
        task.cancel()
        await asyncio.sleep(0)
    assert not task.done()
    release.set()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert steps == ["started", "finished"]


async def test_a_cleanup_that_fails_raises_its_error() -> None:
    async def cleanup() -> None:
        raise ValueError("broken")

    with pytest.raises(ValueError):
        await run_to_end(cleanup())
