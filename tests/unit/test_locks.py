"""Every advisory-lock key range is disjoint from every other, for every partition the settings allow."""

import pytest
from pydantic import ValidationError

from infra import locks
from infra.settings import Settings


def _ranges() -> dict[str, range]:
    out = {name: range(base, base + locks.MAX_PARTITIONS) for name, base in locks.PARTITIONED_BASES.items()}
    out["migration"] = range(locks.MIGRATION, locks.MIGRATION + 1)
    out["space fill"] = range(locks.SPACE_FILL_BASE, locks.SPACE_FILL_BASE + locks.MAX_SPACE_KEY)
    out["space write"] = range(locks.SPACE_WRITE_BASE, locks.SPACE_WRITE_BASE + locks.MAX_SPACE_KEY)
    return out


def test_no_two_lock_ranges_meet() -> None:
    ranges = sorted(_ranges().items(), key=lambda kv: kv[1].start)
    for (name, first), (other, second) in zip(ranges, ranges[1:]):
        assert first.stop <= second.start, (name, other)


def test_every_key_fits_a_bigint() -> None:
    assert all(r.stop < 1 << 63 for r in _ranges().values())


def test_the_keys_are_the_ones_earlier_releases_took() -> None:
    """Two releases on one database during an upgrade must take the same locks, or both would lead."""
    assert (locks.writer_key(0), locks.MIGRATION, locks.gateway_key(3)) == (0x70616D00, 0x70616D6D, 0x70616D7303)
    assert locks.space_write_key(7) == 0x70616D6500_0007 and locks.space_fill_key(7) == 0x70616D6600_0007


@pytest.mark.parametrize("partition", [-1, locks.MAX_PARTITIONS])
def test_a_partition_whose_key_would_meet_another_lock_is_refused(partition: int) -> None:
    with pytest.raises(ValueError):
        locks.writer_key(partition)
    with pytest.raises(ValidationError):
        Settings(partition=partition)
