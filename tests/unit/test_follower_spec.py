"""The projector's follower keeps the names it had before the kernel follower: its durable consumer, its
checkpoint row, its notify channel and its advisory lock.

Why: a running older projector and a new one must contend for the same lock (one leads, the other is a
hot standby), readers wait on the same channel, and operators find the same consumer.
"""

from __future__ import annotations

from infra.projections import NOTIFY_CHANNEL, PROJECTION
from pamledger.followers import FOLLOWERS
from projector.step import PROJECTOR


def test_the_projector_follower_keeps_its_consumer_checkpoint_channel_and_lock() -> None:
    assert PROJECTOR.durable(0) == "pamledger-projector-p0"
    assert (PROJECTOR.checkpoint, PROJECTOR.notify_channel) == (PROJECTION, NOTIFY_CHANNEL)
    assert PROJECTOR.lock_key(3) == 0x70616D70_00 + 3


def test_followers_have_distinct_names_checkpoints_channels_and_locks() -> None:
    for field in ("name", "checkpoint", "notify_channel", "lock_base"):
        values = [getattr(spec, field) for spec in FOLLOWERS]
        assert len(values) == len(set(values)), field


def test_no_follower_lock_collides_with_the_writer_or_gateway_lock_of_any_partition() -> None:
    """Leadership locks are bases plus a partition: a follower's range must not meet the writer's or the
    gateway's, or two roles would block each other (one of them never leading)."""
    from infra.locks import MAX_PARTITIONS, gateway_key, writer_key

    partitions = range(MAX_PARTITIONS)
    taken = {writer_key(p) for p in partitions} | {gateway_key(p) for p in partitions}
    for spec in FOLLOWERS:
        assert not taken & {spec.lock_key(p) for p in partitions}, spec.name
        taken |= {spec.lock_key(p) for p in partitions}


def test_a_follower_of_another_partition_is_refused_until_checkpoints_are_keyed_by_partition() -> None:
    """The checkpoint row and channel are per follower name: a partition-1 follower would share partition
    0's position and skip or repeat events, so building one fails loudly."""
    import pytest

    from infra.follower import Follower
    from infra.settings import Settings

    with pytest.raises(ValueError, match="partition 0"):
        Follower(PROJECTOR, None, None, "STREAM", "pam", 1, Settings().follower)  # type: ignore[arg-type]
