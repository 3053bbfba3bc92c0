"""A snapshot diff's oversized entry is cut to the longest prefix in ledger order that fits (query.snapshot_diff):
versions and events together, a version before its own event, never nothing."""

from __future__ import annotations

import pytest

from query.snapshot_diff import prefix_within

V = [(10, b"v" * 99), (20, b"v" * 99), (30, b"v" * 99)]  # each costs 100 with its comma
E = [(10, b"e" * 49), (20, b"e" * 49), (30, b"e" * 49)]  # each costs 50


@pytest.mark.parametrize("budget, versions, events", [
    (10_000, 3, 3),  # everything fits
    (150, 1, 1),  # the first version and its event
    (249, 1, 1),  # the second version does not fit: its event waits too (one ledger prefix)
    (250, 2, 1),  # the second version fits, its event does not
    (300, 2, 2),
    (1, 1, 0),  # nothing fits: the first row goes in anyway
])
def test_the_cut_keeps_a_ledger_ordered_prefix_within_the_budget(budget: int, versions: int, events: int) -> None:
    kept_v, kept_e, size = prefix_within(V, E, budget, 0)
    assert (kept_v, kept_e) == (V[:versions], E[:events])
    assert size == 100 * versions + 50 * events
    assert size <= budget or versions + events == 1


def test_the_entrys_own_fields_count_against_the_budget() -> None:
    kept_v, kept_e, size = prefix_within(V, E, 250, 100)
    assert (len(kept_v), len(kept_e), size) == (1, 1, 250)
