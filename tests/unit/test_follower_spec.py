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


def test_a_follower_of_another_partition_has_a_checkpoint_and_channel_of_its_own() -> None:
    """Partition 0 keeps the one-partition names (an existing ledger's checkpoint is found where it was);
    another partition's follower never shares partition 0's position."""
    from infra.follower import Follower
    from infra.settings import Settings

    first = Follower(PROJECTOR, None, None, "STREAM", "pam", 0, Settings().follower)  # type: ignore[arg-type]
    other = Follower(PROJECTOR, None, None, "STREAM_P1", "pam", 1, Settings().follower)  # type: ignore[arg-type]
    assert (first.spec.checkpoint, first.spec.notify_channel) == (PROJECTOR.checkpoint, PROJECTOR.notify_channel)
    assert other.spec.checkpoint == f"{PROJECTOR.checkpoint}.p1"
    assert other.spec.notify_channel == f"{PROJECTOR.notify_channel}_p1"
    assert (other.durable, other.subject) == ("pamledger-projector-p1", "pam.ledger.p1.>")
