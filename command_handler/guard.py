"""What the writer checks before it appends: the chain's tail links, and the stream holds no sequence the
ledger lacks.

Why: appending onto a forged tail chains new rows to it, and appending after the ledger's tail was cut off
reuses sequences that the stream and its subscribers already saw with other events (invariants 3 and 13).
Both are checked when the writer starts and, while either refuses, before every batch, so the writer heals
by itself once the chain is repaired or `pamledger stream rebuild --force` replaces the stream. When
JetStream does not answer the writer appends anyway (Postgres is the source of truth, and the relay checks
the stream again before it publishes anything) and checks again before later batches, at most every
`writer.stream_check_seconds`.
"""

from __future__ import annotations

import asyncio
from typing import Any

import nats
import structlog
from nats.aio.client import Client

from command_handler.store import PostgresLedgerStore
from infra.partitions import partition_stream
from infra.ledger_identity import REBUILD_STREAM, Disagreement, stream_reuse
from infra.settings import Settings
from pamledger_client.protocol.tasks import reraise_if_cancelled
from schemas.errors import ServiceUnavailable

log = structlog.get_logger(__name__)


class AppendGuard:
    """The writer's reasons not to append (none: it may), re-checked while there are any."""

    def __init__(self, settings: Settings, store: PostgresLedgerStore, nc: Client):
        self.settings = settings
        self.store = store
        self.nc = nc
        self.chain_broken: str | None = None  # why the chain's tail does not verify
        self.stream_refused: Disagreement | None = None  # why appending would reuse a sequence of the stream
        self.stream_unchecked: str | None = None  # why the stream could not be checked (JetStream silent)
        self._next_stream_check = 0.0

    def due(self) -> bool:
        """Whether a check must run before the next batch."""
        return bool(self.chain_broken or self.stream_refused
                    or (self.stream_unchecked and _now() >= self._next_stream_check))

    async def check(self) -> None:
        """Check the chain's tail and the stream (again), logging one line per change."""
        broken = await self.store.broken_tail(self.settings.writer.tail_check_rows)
        if broken != self.chain_broken:
            if broken:
                log.error("writer.chain_broken", reason=broken, recovery="pamledger verify")
            else:
                log.info("writer.chain_intact")
        self.chain_broken = broken
        await self._check_stream()

    async def _check_stream(self) -> None:
        timeout = self.settings.writer.stream_check_seconds
        try:
            refused = await stream_reuse(self.store.conn, self.nc.jetstream(timeout=timeout),
                                         partition_stream(self.settings.stream_name, self.store.partition),
                                         self.store.partition)
        except (nats.errors.Error, asyncio.TimeoutError) as exc:
            reraise_if_cancelled()
            if self.stream_unchecked is None:
                log.warning("writer.stream_unchecked", error=type(exc).__name__,
                            refusing=self.stream_refused is not None)
            # A refusal stands until a check clears it; without one, append (Postgres decides) and retry later.
            self.stream_unchecked = type(exc).__name__
            self._next_stream_check = _now() + timeout
            return
        if self.stream_unchecked is not None:
            log.info("writer.stream_checked")
        self.stream_unchecked = None
        if refused != self.stream_refused:
            if refused:
                log.error("writer.stream_ahead", reason=refused.message(), ledger_head=refused.ledger_head,
                          stream_sequence=refused.found_sequence, recovery=refused.recovery)
            else:
                log.info("writer.stream_agreed")
        self.stream_refused = refused

    def refusal(self) -> ServiceUnavailable | None:
        """The error every command gets while the writer must not append (None: it may)."""
        if self.chain_broken:
            return ServiceUnavailable(
                "the ledger's hash chain is broken at its tail; the writer appends nothing until it is repaired",
                details={"reason": self.chain_broken, "check": "pamledger verify"})
        if self.stream_refused:
            d = self.stream_refused
            return ServiceUnavailable(
                "the JetStream stream of this ledger holds sequences the ledger lacks (was its tail cut off?);"
                " the writer appends nothing, so as not to reuse them",
                details={"reason": d.message(), "ledger_head": d.ledger_head, "stream_sequence": d.found_sequence,
                         "check": "pamledger verify", "recovery": f"{REBUILD_STREAM} --force"})
        return None

    def status(self) -> dict[str, Any]:
        return {"chain_broken": self.chain_broken,
                "stream_refused": self.stream_refused.message() if self.stream_refused else None,
                "stream_unchecked": self.stream_unchecked}


def _now() -> float:
    return asyncio.get_running_loop().time()
