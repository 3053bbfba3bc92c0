"""The projector's follower keeps the names it had before the kernel follower: its durable consumer, its
checkpoint row, its notify channel and its advisory lock.

Why: a running older projector and a new one must contend for the same lock (one leads, the other is a
hot standby), readers wait on the same channel, and operators find the same consumer.
"""

from __future__ import annotations

from infra.projections import NOTIFY_CHANNEL, PROJECTION
from pamledger.runtime import FOLLOWERS
from projector.step import PROJECTOR


def test_the_projector_follower_keeps_its_consumer_checkpoint_channel_and_lock() -> None:
    assert PROJECTOR.durable(0) == "pamledger-projector-p0"
    assert (PROJECTOR.checkpoint, PROJECTOR.notify_channel) == (PROJECTION, NOTIFY_CHANNEL)
    assert PROJECTOR.lock_key(3) == 0x70616D70_00 + 3


def test_followers_have_distinct_names_checkpoints_channels_and_locks() -> None:
    for field in ("name", "checkpoint", "notify_channel", "lock_base"):
        values = [getattr(spec, field) for spec in FOLLOWERS]
        assert len(values) == len(set(values)), field
