"""What the indexer role runs beside its follower: the default space at start, the outbox sender, the filler.

Why here and not in the follower: none of it may hold the follower's transaction or wait in its loop. The
three run in every indexer process (a standby too): registration is idempotent (the space id is the key),
the sender takes rows with SKIP LOCKED, and a fill holds its space's advisory lock.
"""

from __future__ import annotations

import asyncio
from typing import Any

import msgspec
import psycopg
import structlog

from embedding.embedders import Embedder
from embedding.known import descriptor_for, embedder_for
from embedding.store import SpaceRow, find_space, list_spaces
from indexer.outbox import INDEXER_ACTOR, send_forever
from indexer.rebuild import FillBusy, fill_space
from infra.requester import CommandRequester
from infra.settings import IndexerSettings
from schemas.common import SYSTEM_SCOPE
from schemas.embedding import EmbeddingSpace
from schemas.errors import PamledgerError

log = structlog.get_logger(__name__)

INITIAL_DEFAULT_KEY = "default-space:initial"


async def register_space(requester: CommandRequester, space: EmbeddingSpace) -> dict[str, Any]:
    """Register a space (a replay when it is registered already with this very descriptor)."""
    return await requester.command("register_embedding_space", {
        "scope_id": SYSTEM_SCOPE, "space": msgspec.to_builtins(space), "actor": INDEXER_ACTOR})


async def set_default(requester: CommandRequester, embedding_space_id: str, key: str) -> dict[str, Any]:
    """Record the explicit step that makes a space the default (`index_rebuilt` {default_space_set})."""
    return await requester.command("record_index_event", {
        "scope_id": SYSTEM_SCOPE, "event_type": "index_rebuilt", "actor": INDEXER_ACTOR,
        "payload": {"action": "default_space_set", "embedding_space_id": embedding_space_id},
        "idempotency_key": key})


async def ensure_default_space(requester: CommandRequester, database_url: str, model: str,
                               retry_seconds: float = 0.5) -> None:
    """Register the configured space and, while no space is the default, make it the default (once ever: the
    key is fixed, so a later start replays the first choice instead of overriding a switch made since).
    Retries until the writer answers."""
    space = descriptor_for(model)
    while True:
        try:
            await register_space(requester, space)
            async with await psycopg.AsyncConnection.connect(database_url, autocommit=True) as conn:
                current = await find_space(conn, None)
            if current is None:
                await set_default(requester, space.embedding_space_id, INITIAL_DEFAULT_KEY)
            log.info("indexer.default_space_registered", embedding_space_id=space.embedding_space_id)
            return
        except PamledgerError as exc:
            if exc.code not in ("service_unavailable", "internal_error"):
                # Refused for good (this id is registered with another descriptor: a changed model file under
                # the same space id). Say it once; the registered spaces go on being indexed.
                log.error("indexer.default_space_refused", embedding_space_id=space.embedding_space_id,
                          code=exc.code, reason=exc.message)
                return
            await asyncio.sleep(retry_seconds)
        except Exception as exc:  # noqa: BLE001 - writer or database not there yet: try again
            log.debug("indexer.default_space_waiting", error=type(exc).__name__)
            await asyncio.sleep(retry_seconds)


async def usable_embedder(space: SpaceRow, threads: int | None) -> Embedder | None:
    """This build's embedder for the space, loaded in a thread (the model takes seconds), or None."""
    return await asyncio.to_thread(embedder_for, space.descriptor, threads)


async def fill_forever(database_url: str, settings: IndexerSettings) -> None:
    """Fill every `filling` space this build can embed, one at a time, forever (see indexer.rebuild)."""
    threads = settings.model_threads or None
    while True:
        try:
            async with await psycopg.AsyncConnection.connect(database_url, autocommit=True) as conn:
                while True:
                    for space in await list_spaces(conn):
                        embedder = await usable_embedder(space, threads) if space.state == "filling" else None
                        if embedder is None:
                            continue
                        try:
                            report = await fill_space(conn, space, embedder, settings.rebuild_batch)
                        except FillBusy:
                            continue
                        log.info("indexer.space_filled", embedding_space_id=report.embedding_space_id,
                                 objects=report.total, embedded=report.embedded,
                                 filled_sequence=report.filled_sequence, seconds=round(report.seconds, 3))
                    await asyncio.sleep(settings.rebuild_poll_seconds)
        except Exception as exc:  # noqa: BLE001 - retried; the follower goes on meanwhile
            log.warning("indexer.fill_failed", error=type(exc).__name__, detail=str(exc).splitlines()[0:1])
            await asyncio.sleep(settings.rebuild_poll_seconds)


async def run_beside_follower(requester: CommandRequester, database_url: str, settings: IndexerSettings) -> None:
    """The indexer role's companions, until cancelled."""
    await asyncio.gather(
        ensure_default_space(requester, database_url, settings.default_space),
        send_forever(database_url, requester, settings.outbox_batch, settings.outbox_poll_seconds,
                     settings.outbox_retry_max_seconds),
        fill_forever(database_url, settings),
    )
