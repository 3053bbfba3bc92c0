"""The follower's stuck state: one log-worthy change per new sequence or reason, capped backoff, recovery."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

from infra.stuck import StuckState, describe, traceback_text

T0 = datetime(2026, 1, 1, tzinfo=timezone.utc)


def test_a_retry_of_the_same_failure_is_not_a_state_change() -> None:
    state = StuckState(0.5, 30.0)
    assert state.failed(7, "RaiseException: no", T0) is True
    assert state.failed(7, "RaiseException: no", T0 + timedelta(seconds=1)) is False
    assert state.report() == {"sequence": 7, "reason": "RaiseException: no", "since": "2026-01-01T00:00:00Z",
                              "attempts": 2}


def test_a_new_reason_or_sequence_is_a_state_change() -> None:
    state = StuckState(0.5, 30.0)
    state.failed(7, "a", T0)
    assert state.failed(7, "b", T0) is True
    assert state.failed(8, "b", T0 + timedelta(seconds=5)) is True
    assert state.current is not None and state.current.attempts == 1 and state.current.since > T0


def test_backoff_doubles_from_the_first_delay_up_to_the_cap() -> None:
    state = StuckState(0.5, 30.0)
    assert state.delay() == 0.0
    delays = []
    for _ in range(10):
        state.failed(3, "x", T0)
        delays.append(state.delay())
    assert delays == [0.5, 1.0, 2.0, 4.0, 8.0, 16.0, 30.0, 30.0, 30.0, 30.0]


def test_applying_through_the_stuck_sequence_clears_it_and_returns_what_it_was() -> None:
    state = StuckState(0.5, 30.0)
    state.failed(5, "x", T0)
    assert state.passed(4) is None and state.current is not None
    left = state.passed(5)
    assert left is not None and left.sequence == 5 and state.report() is None and state.delay() == 0.0


def test_a_reason_is_one_short_line() -> None:
    reason = describe(ValueError("first line\nCONTEXT: PL/pgSQL function f() line 3\n" + "x" * 1000))
    assert reason == "ValueError: first line"
    assert len(describe(ValueError("y" * 5000))) == 300


def test_a_logged_traceback_ends_in_the_reason_not_the_detail_lines() -> None:
    message = "bad value\nDETAIL: " + "se" + "cret"  # not spelt out in the source line the traceback quotes
    try:
        raise ValueError(message)
    except ValueError as exc:
        text = traceback_text(exc)
    assert text.startswith("Traceback (most recent call last):") and "test_stuck.py" in text
    assert text.endswith("ValueError: bad value") and "secret" not in text
