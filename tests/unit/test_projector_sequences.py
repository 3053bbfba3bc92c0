"""A follower's rule for pushed stream sequences: apply the contiguous run, skip what is applied, stop at a
gap (the follower then re-subscribes from its checkpoint)."""

from __future__ import annotations

from infra.follower import contiguous


def test_a_contiguous_batch_is_taken_whole() -> None:
    assert contiguous([11, 12, 13], 10) == ([(0, 11), (1, 12), (2, 13)], None)


def test_redeliveries_and_duplicates_are_skipped() -> None:
    assert contiguous([9, 10, 11, 11, 12], 10) == ([(2, 11), (4, 12)], None)


def test_nothing_after_a_gap_is_taken() -> None:
    assert contiguous([11, 13, 14], 10) == ([(0, 11)], 13)
    assert contiguous([12], 10) == ([], 12)


def test_an_all_old_batch_takes_nothing() -> None:
    assert contiguous([3, 4], 10) == ([], None)
