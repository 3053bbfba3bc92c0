"""The follower's prepare-ahead bookkeeping (infra.prepare_ahead.Ahead): a result prepared ahead is used only
for the very same events, anything else is prepared again, and a discarded prepare is stopped, never left
running beside the follower.

Why without servers: this is scheduling only; the connection is an opaque token the step receives (what
prepare reads is tested against real Postgres in tests/integration/test_indexer_ahead.py).
"""

from __future__ import annotations

import asyncio
from typing import Any

from infra.prepare_ahead import Ahead


class _Conn:
    closed = False
    broken = False

    async def close(self) -> None:
        self.closed = True


class _Step:
    def __init__(self) -> None:
        self.calls: list[tuple[list[int], Any]] = []
        self.gate = asyncio.Event()
        self.gate.set()
        self.running = 0

    async def prepare(self, conn: Any, events: list[tuple[int, bytes]], pending: Any) -> Any:
        self.calls.append(([s for s, _ in events], pending))
        self.running += 1
        try:
            await self.gate.wait()
        finally:
            self.running -= 1
        return ("prepared", [s for s, _ in events], pending)

    async def apply_prepared(self, conn: Any, events: Any, prepared: Any) -> None:
        raise AssertionError("not called here")


def _batch(*seqs: int) -> list[tuple[int, bytes]]:
    return [(s, b"{}") for s in seqs]


async def _connect() -> Any:
    return _Conn()


async def test_a_batch_prepared_ahead_is_used_for_the_same_events_only() -> None:
    step = _Step()
    ahead = Ahead(step, _Conn(), _connect)  # type: ignore[arg-type]
    ahead.start(_batch(3, 4), 2, "k")
    assert ahead.span == 2
    assert await ahead.prepared_for(_batch(3, 4)) == ("prepared", [3, 4], "k")
    assert len(step.calls) == 1 and ahead.span == 0
    ahead.start(_batch(5, 6), 2, "k2")
    assert await ahead.prepared_for(_batch(5)) == ("prepared", [5], None)  # other events: prepared again
    await ahead.close()


async def test_a_discarded_prepare_is_stopped_and_its_connection_not_reused() -> None:
    step = _Step()
    step.gate.clear()
    ahead = Ahead(step, _Conn(), _connect)  # type: ignore[arg-type]
    ahead.start(_batch(7), 1, "k")
    await asyncio.sleep(0)
    await asyncio.sleep(0)
    assert step.running == 1
    used = ahead._own
    await ahead.discard()
    assert step.running == 0 and ahead.span == 0
    assert used is not None and used.closed and ahead._own is None
    step.gate.set()
    assert await ahead.prepared_for(_batch(7)) == ("prepared", [7], None)
    await ahead.close()


async def test_without_a_connection_factory_nothing_runs_ahead() -> None:
    step = _Step()
    ahead = Ahead(step, _Conn(), None)  # type: ignore[arg-type]
    ahead.start(_batch(1), 1, "k")
    assert ahead.span == 0 and not step.calls
    assert await ahead.prepared_for(_batch(1)) == ("prepared", [1], None)
