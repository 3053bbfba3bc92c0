"""`resources/subscribe` on a scope's events URI: a doorbell, `notifications/resources/updated`, when the scope
gets a new ledger event, so a host polls (pamledger.poll, or the events resource) only when there is news.

Why a doorbell and not the events themselves: MCP notifications are not acknowledged, so a host can miss
one; the position lives in the subscription or the `after_sequence` cursor, never in the notification. Behind
each ring is an SDK push subscription of the caller's (new events only, authorized per event like any).
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

import structlog

from mcp_binding.callers import Caller
from mcp_binding.resources import parse
from memory_client.errors import PamspecError

log = structlog.get_logger(__name__)


class Doorbells:
    """The open doorbells, by (session, uri); each a task that rings until unsubscribed or the session ends."""

    def __init__(self) -> None:
        self._rings: dict[tuple[int, str], asyncio.Task[None]] = {}

    async def subscribe(self, session: Any, caller: Caller, uri: str) -> None:
        target = parse(uri)
        if target.kind != "events":
            raise PamspecError.of("invalid_request", "only a scope's events resource can be subscribed to "
                                  "(pamspec://scope/{scope_id}/events)", {"uri": uri[:200]})
        key = (id(session), uri)
        if key in self._rings and not self._rings[key].done():
            return
        client = await caller.client()
        subscription = await client.subscribe(target.scope_id, await caller.actor())  # refused here if not allowed
        self._rings[key] = asyncio.create_task(self._ring(session, uri, subscription))

    async def unsubscribe(self, session: Any, uri: str) -> None:
        task = self._rings.pop((id(session), uri), None)
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task

    async def _ring(self, session: Any, uri: str, subscription: Any) -> None:
        try:
            async for _ in subscription:
                await session.send_resource_updated(uri)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # noqa: BLE001 - the session went away, or delivery ended: stop ringing
            log.info("mcp.doorbell_stopped", uri=uri[:200], reason=type(exc).__name__)
        finally:
            with contextlib.suppress(Exception):
                await asyncio.shield(subscription.close("unsubscribed"))

    async def close(self) -> None:
        for key in list(self._rings):
            task = self._rings.pop(key)
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
