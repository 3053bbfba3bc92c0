"""The ledger identity check says once that it cannot run (NATS away), not on every retry.

Why: the relay, projector and gateway logged `*.identity_check_failed` every 2 s plus a request timeout
for as long as NATS was away, so the log grew with the outage.
"""

from __future__ import annotations

import asyncio

import nats.errors
from structlog.testing import capture_logs

from infra.ledger_identity import Disagreement, wait_for_agreement


async def test_a_check_that_cannot_run_is_logged_once_whatever_the_errors_then_once_when_it_runs() -> None:
    outcomes: list[BaseException | None] = [
        asyncio.TimeoutError(), asyncio.TimeoutError(), nats.errors.NoRespondersError(), asyncio.TimeoutError(),
        nats.errors.NoRespondersError(), None]

    async def check() -> Disagreement | None:
        outcome = outcomes.pop(0)
        if outcome is not None:
            raise outcome
        return None

    with capture_logs() as logs:
        await wait_for_agreement("projector", check, retry_seconds=0)
    said = [(e["event"], e.get("error")) for e in logs if e["log_level"] != "debug"]
    assert said == [("projector.identity_check_failed", "TimeoutError"),
                    ("projector.identity_checked", None)]
    assert next(e for e in logs if e["event"] == "projector.identity_checked")["after_errors"] == [
        "NoRespondersError", "TimeoutError"]
