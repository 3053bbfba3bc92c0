"""A role loop's failures: one log line per change of reason, a traceback only for the unexpected, backoff."""

from __future__ import annotations

import asyncio

from structlog.testing import capture_logs

from infra.role_failures import RoleFailures


def boom(message: str) -> RuntimeError:
    try:
        raise RuntimeError(message)
    except RuntimeError as exc:
        return exc


def test_the_same_failure_again_and_again_logs_once_and_backs_off_to_the_cap() -> None:
    failures = RoleFailures("writer", 0.5, 5.0)
    with capture_logs() as logs:
        delays = [failures.failed(ConnectionError("connection refused"), expected=True) for _ in range(100)]
    assert [e["event"] for e in logs] == ["writer.lost_database"]
    assert "exc_info" not in logs[0]
    assert delays[:5] == [0.5, 1.0, 2.0, 4.0, 5.0] and delays[-1] == 5.0


def test_an_unexpected_failure_logs_its_traceback_once_per_reason() -> None:
    failures = RoleFailures("gateway", 0.5, 5.0)
    with capture_logs() as logs:
        for message in ("first bug", "first bug", "second bug", "second bug"):
            failures.failed(boom(message), expected=False)
    assert [(e["event"], e["reason"]) for e in logs] == [
        ("gateway.crashed", "RuntimeError: first bug"), ("gateway.crashed", "RuntimeError: second bug")]
    assert all(isinstance(e["exc_info"], RuntimeError) for e in logs)


def test_serving_again_is_said_once_and_restarts_the_backoff() -> None:
    failures = RoleFailures("projector", 0.5, 5.0)
    with capture_logs() as logs:
        failures.serving()  # never failed: nothing to say
        for _ in range(3):
            failures.failed(ConnectionError("down"), expected=True)
        failures.serving()
        failures.serving()
        delay = failures.failed(ConnectionError("down"), expected=True)
    assert [e["event"] for e in logs] == ["projector.lost_database", "projector.recovered",
                                          "projector.lost_database"]
    assert logs[1]["after_attempts"] == 3
    assert delay == 0.5


async def test_a_run_that_fails_soon_after_its_lock_keeps_backing_off() -> None:
    """Taking the lock is not serving: a role that fails right after it must not start its backoff afresh
    (it retried every 0.5 s, a traceback each time)."""
    failures = RoleFailures("gateway", 0.5, 5.0, healthy_seconds=30.0)
    with capture_logs() as logs:
        delays = []
        for _ in range(5):
            with failures.running():
                delays.append(failures.failed(boom("bad row"), expected=False))
    assert delays == [0.5, 1.0, 2.0, 4.0, 5.0]
    assert [e["event"] for e in logs] == ["gateway.crashed"]


async def test_a_run_that_lasts_serves_again_once() -> None:
    failures = RoleFailures("writer", 0.5, 5.0, healthy_seconds=0.05)
    with capture_logs() as logs:
        failures.failed(ConnectionError("down"), expected=True)
        with failures.running():
            await asyncio.sleep(0.3)
        delay = failures.failed(ConnectionError("down"), expected=True)
    # Only this role's lines: the event loop may be shared with tasks other tests left running.
    assert [e["event"] for e in logs if e["event"].startswith("writer.")] == [
        "writer.lost_database", "writer.recovered", "writer.lost_database"]
    assert delay == 0.5
