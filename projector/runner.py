"""The live projector: a durable JetStream pull consumer applying ledger events to current_objects.

One projector per partition leads (Postgres advisory lock); others wait. On start it reads its
checkpoint from Postgres and (re)creates its durable consumer to start right after it, so the consumer's
position can never run ahead of what was committed. Rows and checkpoint commit in one transaction, then
the batch is acknowledged (AckPolicy.ALL: one ack per batch).
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import nats
import psycopg
import structlog
from nats.aio.client import Client as NATS
from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy
from nats.js.errors import NotFoundError

from projector.rows import Row, current_row, fold
from projector.store import apply_rows, checkpoint
from infra.tasks import reraise_if_cancelled

log = structlog.get_logger(__name__)
_PROJECTOR_LOCK_BASE = 0x70616D70_00  # 'pamp' + partition
LINGER_SECONDS = 0.01


def projector_lock_key(partition: int) -> int:
    return _PROJECTOR_LOCK_BASE + partition


class Projector:
    """Follows `{prefix}.ledger.p{partition}.>` and keeps current_objects in step."""

    def __init__(self, nc: NATS, conn: psycopg.AsyncConnection[Any], stream: str, prefix: str, partition: int,
                 batch: int = 500):
        self.nc = nc
        self.conn = conn
        self.stream = stream
        self.subject = f"{prefix}.ledger.p{partition}.>"
        self.durable = f"pamledger-projector-p{partition}"
        self.batch = batch
        self.applied = 0
        self._last_apply = 0.0
        self._busy = True

    async def run(self) -> None:
        """Apply batches forever; re-subscribes when the stream or consumer is lost."""
        while True:
            try:
                sub = await self._subscribe()
                while True:
                    await self._step(sub)
            except (NotFoundError, nats.errors.Error) as exc:
                reraise_if_cancelled()
                log.warning("projector.resubscribing", error=type(exc).__name__, applied=self.applied)
                await asyncio.sleep(0.5)

    async def _subscribe(self) -> Any:
        js = self.nc.jetstream()
        self.applied = await checkpoint(self.conn)
        await js.stream_info(self.stream)  # raises NotFoundError until the relay created it
        try:
            await js.delete_consumer(self.stream, self.durable)
        except NotFoundError:
            pass
        config = ConsumerConfig(
            durable_name=self.durable, ack_policy=AckPolicy.ALL, deliver_policy=DeliverPolicy.BY_START_SEQUENCE,
            opt_start_seq=self.applied + 1, filter_subject=self.subject, max_ack_pending=-1, ack_wait=60,
        )
        await js.add_consumer(self.stream, config)
        log.info("projector.following", from_sequence=self.applied + 1, stream=self.stream)
        return await js.pull_subscribe_bind(self.durable, self.stream)

    async def _step(self, sub: Any) -> None:
        # A short linger lets events gather into fewer, larger transactions under load: it bounds the
        # commit rate at 1/LINGER while adding at most LINGER to the lag.
        wait = self._last_apply + LINGER_SECONDS - time.monotonic()
        if wait > 0:
            await asyncio.sleep(wait)
        # nats-py's fetch(n) returns at once with whatever is pending, but when nothing is, it lingers
        # until n messages arrived or the timeout passed. So a caught-up projector waits for ONE message
        # (returned the moment it lands) and then takes everything pending with fetch(batch).
        try:
            msgs = await sub.fetch(self.batch if self._busy else 1, timeout=2.0)
        except asyncio.TimeoutError:
            reraise_if_cancelled()
            self._busy = False
            return
        self._busy = len(msgs) > 0
        if not msgs:  # nats-py can return at once with nothing (a stale status); never spin on that
            await asyncio.sleep(0.01)
            return
        rows: dict[tuple[str, str], Row] = {}
        through = self.applied
        for msg in msgs:
            seq = msg.metadata.sequence.stream
            if seq <= self.applied:
                continue  # redelivered: already in the projection
            fold(rows, current_row(msg.data, seq))
            through = max(through, seq)
        if through > self.applied:
            await apply_rows(self.conn, list(rows.values()), through)
            self.applied = through
            self._last_apply = time.monotonic()
        await msgs[-1].ack()
