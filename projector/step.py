"""The projector's apply step: a batch of ledger events → current_objects and current_relationships rows (the kernel follower does the rest).

Why only this: following the stream (delivery, gaps, checkpoint, acks, stuck events, leadership) is the
kernel's `infra.follower`; what is the projector's own is the pure fold (`projector.rows`) and the one
statement that writes it (`projector.store`).
"""

from __future__ import annotations

from typing import Any

import psycopg

from infra import locks
from infra.follower import Event, FollowerSpec
from infra.projections import NOTIFY_CHANNEL, PROJECTION
from projector.rows import Row, fold, project
from projector.store import upsert_relationships, upsert_rows


class ProjectorStep:
    """Folds a batch to one row per object and per relationship (the last event wins) and upserts each
    table's rows in one statement, in the follower's transaction (so with its checkpoint)."""

    async def apply(self, conn: psycopg.AsyncConnection[Any], events: list[Event]) -> None:
        rows: dict[tuple[str, str], Row] = {}
        relationships: dict[tuple[str, str], Row] = {}
        for seq, event in events:
            found = project(event, seq)
            if found is not None:
                fold(relationships if found.relationship else rows, found.row)
        if rows:
            await upsert_rows(conn, list(rows.values()))
        if relationships:
            await upsert_relationships(conn, list(relationships.values()))


PROJECTOR = FollowerSpec(name="projector", checkpoint=PROJECTION, notify_channel=NOTIFY_CHANNEL,
                         lock_base=locks.PROJECTOR_BASE, step=ProjectorStep)
