"""The projector's apply step: a batch of ledger events → current_objects rows (the kernel follower does the rest).

Why only this: following the stream (delivery, gaps, checkpoint, acks, stuck events, leadership) is the
kernel's `infra.follower`; what is the projector's own is the pure fold (`projector.rows`) and the one
statement that writes it (`projector.store`).
"""

from __future__ import annotations

from typing import Any

import psycopg

from infra.follower import Event, FollowerSpec
from infra.projections import NOTIFY_CHANNEL, PROJECTION
from projector.rows import Row, current_row, fold
from projector.store import upsert_rows


class ProjectorStep:
    """Folds a batch to one row per object (the last event wins) and upserts them in one statement."""

    async def apply(self, conn: psycopg.AsyncConnection[Any], events: list[Event]) -> None:
        rows: dict[tuple[str, str], Row] = {}
        for seq, event in events:
            fold(rows, current_row(event, seq))
        if rows:
            await upsert_rows(conn, list(rows.values()))


PROJECTOR = FollowerSpec(name="projector", checkpoint=PROJECTION, notify_channel=NOTIFY_CHANNEL,
                         lock_base=0x70616D70_00, step=ProjectorStep)  # lock: 'pamp' + partition
