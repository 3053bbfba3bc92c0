"""A scope's partition: the system scope's is 0, any other's a stable hash of its id; the router reads only
a command's scope_id."""

from __future__ import annotations

from collections import Counter

import pytest

from command_handler.router import scope_of
from infra.partitions import PartitionCountChanged, partition_of, partition_stream
from schemas.common import SYSTEM_SCOPE


def test_one_partition_holds_every_scope() -> None:
    assert {partition_of(f"workspace:{i}", 1) for i in range(100)} == {0}


def test_the_system_scope_lives_in_partition_zero() -> None:
    assert partition_of(SYSTEM_SCOPE, 4) == 0
    assert partition_of(SYSTEM_SCOPE, 108) == 0


def test_a_scope_hashes_to_the_same_partition_on_every_machine_and_release() -> None:
    # Pinned: a change of the hash would send an existing ledger's new scopes elsewhere than before.
    assert [partition_of(f"workspace:{name}", 4) for name in "abcdef"] == [2, 0, 3, 1, 3, 3]
    assert [partition_of(f"workspace:{name}", 7) for name in "abcdef"] == [2, 6, 1, 1, 2, 3]


def test_scopes_spread_over_the_partitions() -> None:
    counts = Counter(partition_of(f"agent:{i}", 4) for i in range(4000))
    assert sorted(counts) == [0, 1, 2, 3]
    assert min(counts.values()) > 800


def test_partition_zero_keeps_the_configured_stream_name() -> None:
    assert partition_stream("PAMLEDGER", 0) == "PAMLEDGER"
    assert partition_stream("PAMLEDGER", 3) == "PAMLEDGER_P3"


def test_a_changed_count_names_both_counts_and_the_way_out() -> None:
    message = str(PartitionCountChanged(4, 2))
    assert "partitions=4" in message and "partitions=2" in message and "PAMLEDGER_PARTITIONS=4" in message


@pytest.mark.parametrize(("data", "scope"), [
    (b'{"scope_id": "workspace:x", "object_type": "claim"}', "workspace:x"),
    (b'{"object_type": "claim"}', None),
    (b'{"scope_id": 7}', None),
    (b'not json', None),
    (b'[1, 2]', None),
])
def test_the_router_reads_the_scope_a_command_names(data: bytes, scope: str | None) -> None:
    assert scope_of(data) == scope
