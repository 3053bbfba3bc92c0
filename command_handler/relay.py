"""The ledger relay: replicates committed ledger rows to JetStream, in order, stream seq == ledger seq.

Every message carries `Nats-Msg-Id = event_id` (deduplication) and `Nats-Expected-Last-Sequence =
ledger_sequence - 1` (order). After a crash, or when the stream was lost, the relay asks the stream for
its last sequence and republishes from the Postgres ledger, the source of truth.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

import nats
from nats.aio.client import Client as NATS
import psycopg
import structlog
from nats.js import JetStreamContext
from nats.js.api import PubAck, StorageType, StreamConfig, StreamInfo
from nats.js.errors import APIError, NotFoundError

from infra import tracing
from infra.ledger import LedgerRow
from infra.ledger_identity import (
    STREAM_KEY, Refusal, ledger_identity, stream_description, stream_disagreement, wait_for_agreement,
)
from pamledger_client.protocol.subjects import ledger_subject, ledger_wildcard, partition_wildcard
from pamledger_client.protocol.tasks import reraise_if_cancelled
from infra.nats_servers import StreamReplicas

log = structlog.get_logger(__name__)
CATCH_UP_CHUNK = 2000
RECONNECT_CHECK_SECONDS = 0.05  # how often a publish awaiting its ack looks for a reconnect
SINGLE = StreamReplicas(1)  # one copy, and never fewer than the stream has: what a lone server keeps
MAX_CONSUMERS = 100_000  # one durable consumer per subscription, plus the projector

_LEDGER_COLUMNS = (
    "ledger_sequence, event_id, operation_id, scope_id, object_id, version_id, event_type, recorded_at,"
    " event, prev_hash, row_hash"
)


def ensure_stream_config(stream_name: str, prefix: str, ledger_id: str | None = None,
                         replicas: int = 1, partition: int | None = None) -> StreamConfig:
    """The stream's configuration; with `ledger_id`, its metadata and description name that ledger. With
    `partition` (a ledger of several partitions: infra.partitions) it holds that partition's subjects only,
    else every ledger subject."""
    subjects = ledger_wildcard(prefix) if partition is None else partition_wildcard(prefix, partition)
    return StreamConfig(
        name=stream_name, subjects=[subjects], storage=StorageType.FILE,
        duplicate_window=120.0, allow_direct=True, num_replicas=replicas,
        max_consumers=MAX_CONSUMERS,  # explicit: nats-server 2.15 otherwise caps a stream at 1,000 consumers
        metadata={STREAM_KEY: ledger_id} if ledger_id else None,
        description=stream_description(ledger_id) if ledger_id else None,
    )


async def ensure_stream(js: JetStreamContext, stream_name: str, prefix: str, ledger_id: str | None = None,
                        replicas: StreamReplicas = SINGLE, partition: int | None = None) -> int:
    """Create the stream (for ledger `ledger_id`, of one `partition` or of all, with `replicas` copies) if it
    is missing, or give an existing one the copies `replicas` wants (JetStream copies the messages to the new
    peers); return its last sequence. NATS refusing the replicas (more than it has servers) is logged, with
    the setting to change, and raised: the relay retries, the writer serves on, its status says the relay is
    behind."""
    try:
        info = await js.stream_info(stream_name)
        current = info.config.num_replicas or 1
        if replicas.wanted(current) != current:
            info = await _replicate(js, info, replicas.wanted(current))
    except NotFoundError:
        try:
            info = await js.add_stream(ensure_stream_config(stream_name, prefix, ledger_id, replicas.count, partition))
        except APIError as exc:
            _log_refused(stream_name, replicas.count, exc)
            raise
        log.info("stream.created", stream=stream_name, ledger_id=ledger_id, replicas=replicas.count)
    return int(info.state.last_seq)


async def _replicate(js: JetStreamContext, info: StreamInfo, replicas: int) -> StreamInfo:
    """Change the stream's replicas (R1 made before a cluster, or nats.stream_replicas changed)."""
    previous = info.config.num_replicas or 1
    try:
        updated = await js.update_stream(info.config.evolve(num_replicas=replicas))
    except APIError as exc:
        _log_refused(info.config.name or "", replicas, exc)
        raise
    log.info("stream.replicas_changed", stream=info.config.name, replicas=replicas, previous=previous)
    return updated


def _log_refused(stream_name: str, replicas: int, exc: APIError) -> None:
    log.error("stream.replicas_refused", stream=stream_name, replicas=replicas, error=exc.description,
              hint="NATS needs a server per replica: set nats.stream_replicas (PAMLEDGER_NATS__STREAM_REPLICAS)"
                   " to at most the number of servers, or give it more servers (nats.nodes)")


class Reconnected(nats.errors.Error):
    """The connection was re-established while a publish awaited its ack: that ack may never come."""


class Relay:
    """Publishes what the writer committed; falls back to reading the ledger whenever it sees a gap."""

    def __init__(self, nc: NATS, database_url: str, stream_name: str, prefix: str, partition: int,
                 publish_timeout: float = 5.0, replicas: StreamReplicas = SINGLE, partitioned: bool = False):
        self.nc = nc
        self.js = nc.jetstream()
        self.database_url = database_url
        self.stream_name = stream_name
        self.prefix = prefix
        self.partition = partition
        self.partitioned = partitioned  # a stream of this partition's subjects only (infra.partitions)
        self.publish_timeout = publish_timeout
        self.replicas = replicas  # the stream's num_replicas (nats.stream_replicas)
        self.published = 0
        self.queue: asyncio.Queue[list[LedgerRow]] = asyncio.Queue()
        self.caught_up = asyncio.Event()
        self.refusal = Refusal()  # why the relay refuses the stream (another ledger's, or ahead), if it does

    def status(self) -> dict[str, Any]:
        """How far replication got, and why the stream is refused if it is (the writer's status reports it)."""
        return {"relayed_sequence": self.published,
                "relay_refused": self.refusal.reason.message() if self.refusal.reason else None}

    def submit(self, rows: list[LedgerRow]) -> None:
        self.queue.put_nowait(rows)

    async def run(self) -> None:
        """Catch up from the ledger, then follow what the writer submits."""
        await self._resync()
        self.caught_up.set()
        await self.follow()

    async def catch_up(self) -> None:
        """Publish every ledger row the stream lacks, then return (what `pamledger stream rebuild` runs)."""
        await self._resync()

    async def follow(self) -> None:
        """Publish what is submitted, in runs; any gap or failure resyncs from the ledger. Never returns."""
        while True:
            rows = await self.queue.get()
            while not self.queue.empty():
                rows = rows + self.queue.get_nowait()
            rows = [r for r in rows if r.ledger_sequence > self.published]
            if not rows:
                continue
            if rows[0].ledger_sequence != self.published + 1:
                await self._resync()
                continue
            try:
                await self._publish(rows)
            except (nats.errors.Error, asyncio.TimeoutError) as exc:
                reraise_if_cancelled()
                log.warning("relay.publish_failed", error=type(exc).__name__, at=self.published)
                await asyncio.sleep(0.2)
                await self._resync()

    async def _resync(self) -> None:
        """Publish every ledger row the stream lacks, reading them from Postgres; first wait until the
        stream is this ledger's and not ahead of it (`pamledger stream rebuild` makes it so)."""
        while True:
            try:
                async with await psycopg.AsyncConnection.connect(self.database_url, autocommit=True) as conn:
                    await wait_for_agreement("relay", lambda: stream_disagreement(
                        conn, self.js, self.stream_name, self.partition), self.refusal)
                    ledger_id = await ledger_identity(conn, self.partition)
                    self.published = await ensure_stream(self.js, self.stream_name, self.prefix, ledger_id,
                                                         self.replicas, self.partition if self.partitioned else None)
                    while True:
                        rows = await self.read_ledger(conn, self.published)
                        if not rows:
                            break
                        await self._publish(rows)
                log.info("relay.caught_up", ledger_sequence=self.published)
                return
            except (nats.errors.Error, asyncio.TimeoutError, psycopg.OperationalError) as exc:
                reraise_if_cancelled()
                log.warning("relay.resync_failed", error=type(exc).__name__)
                await asyncio.sleep(0.5)

    async def read_ledger(self, conn: psycopg.AsyncConnection[Any], after: int) -> list[LedgerRow]:
        """Up to CATCH_UP_CHUNK ledger rows of the partition after `after`, in order."""
        cur = await conn.execute(
            f"SELECT {_LEDGER_COLUMNS} FROM ledger WHERE partition = %s AND ledger_sequence > %s"
            " ORDER BY ledger_sequence LIMIT %s",
            (self.partition, after, CATCH_UP_CHUNK),
        )
        return [
            LedgerRow(ledger_sequence=r[0], event_id=r[1], operation_id=r[2], scope_id=r[3], object_id=r[4],
                      version_id=r[5], event_type=r[6], recorded_at=r[7], event=bytes(r[8]),
                      prev_hash=bytes(r[9]), row_hash=bytes(r[10]))
            for r in await cur.fetchall()
        ]

    async def _publish(self, rows: list[LedgerRow]) -> None:
        """Publish a run of rows with one acknowledgement.

        Every message carries the expected-last-sequence check, and JetStream applies one connection's
        messages in order: if any row of the run was refused, every later one is refused too. So the
        rows go out as plain publishes and only the last waits for its ack; an ack for the last row's
        sequence proves the whole run is in the stream. Anything else raises, and the caller resyncs.
        """
        spans = publish_spans(rows) if tracing.ENABLED else None
        try:
            reconnects = self.nc.stats["reconnects"]
            for row in rows[:-1]:
                await self.nc.publish(self._subject(row), row.event, headers=self._headers(row, spans))
            last = rows[-1]
            ack = await self._acknowledged(last, reconnects, spans)
            if ack.seq != last.ledger_sequence:
                raise nats.errors.Error(f"stream sequence {ack.seq} != ledger sequence {last.ledger_sequence}")
            self.published = last.ledger_sequence
        finally:
            for span in (spans or {}).values():
                span.end()

    async def _acknowledged(self, last: LedgerRow, reconnects: int, spans: dict[str, Any] | None) -> PubAck:
        """Publish `last` and wait for its ack, at most `publish_timeout` and only while the connection is
        the one the run went out on: a run sent just before NATS went away is never acknowledged, so after
        a reconnect the caller resyncs at once (msg-id and expected-last-sequence make a re-publish safe)."""
        ack = asyncio.ensure_future(self.js.publish(self._subject(last), last.event, headers=self._headers(last, spans),
                                                    timeout=self.publish_timeout))
        try:
            while True:
                done, _ = await asyncio.wait({ack}, timeout=RECONNECT_CHECK_SECONDS)
                if done:
                    return ack.result()
                if self.nc.stats["reconnects"] != reconnects:
                    raise Reconnected("NATS reconnected while a run awaited its ack")
        finally:
            if not ack.done():
                ack.cancel()
                with contextlib.suppress(asyncio.CancelledError, nats.errors.Error, asyncio.TimeoutError):
                    await ack

    def _subject(self, row: LedgerRow) -> str:
        return ledger_subject(self.prefix, self.partition, row.scope_id, row.event_type)

    @staticmethod
    def _headers(row: LedgerRow, spans: dict[str, Any] | None = None) -> dict[str, str]:
        headers = {
            "Nats-Msg-Id": row.event_id,
            "Nats-Expected-Last-Sequence": str(row.ledger_sequence - 1),
            "Pam-Ledger-Sequence": str(row.ledger_sequence),
            "Pam-Event-Type": row.event_type,
            "Pam-Row-Hash": row.row_hash.hex(),  # anchors the ledger head outside Postgres (`verify`)
        }
        if spans and (span := spans.get(row.operation_id or "")) is not None:
            headers.update(tracing.traceparent(span))  # the followers' apply continues the command's trace
        return headers


def publish_spans(rows: list[LedgerRow]) -> dict[str, Any]:
    """A `relay.publish` span per command the run carries, under the span the writer handed over for it
    (by operation id); rows read back from the ledger (catch-up) have none and get no span."""
    spans: dict[str, Any] = {}
    for row in rows:
        if row.operation_id is None or row.operation_id in spans:
            continue
        parent = tracing.take_over(row.operation_id)
        if parent is not None:
            spans[row.operation_id] = tracing.start("relay.publish", parent, {
                "pamledger.ledger_sequence": row.ledger_sequence, "pamledger.run_size": len(rows)})
    return spans
