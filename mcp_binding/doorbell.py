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
from pamledger_client.errors import PamspecError

log = structlog.get_logger(__name__)


class Doorbells:
    """The open doorbells by (connection, uri): the connection is the MCP session id over HTTP, `stdio` on
    stdio (the SDK hands each request a ServerSession of its own, so a session object names no connection).
    Each is a task that rings until unsubscribed, its connection ends, or a ring cannot be sent."""

    def __init__(self) -> None:
        self._rings: dict[tuple[str, str], asyncio.Task[None]] = {}

    async def subscribe(self, connection: str, session: Any, caller: Caller, uri: str) -> None:
        target = parse(uri)
        if target.kind != "events":
            raise PamspecError.of("invalid_request", "only a scope's events resource can be subscribed to "
                                  "(pamspec://scope/{scope_id}/events)", {"uri": uri[:200]})
        key = (connection, uri)
        if key in self._rings:
            return
        client = await caller.client()
        subscription = await client.subscribe(target.scope_id, await caller.actor())  # refused here if not allowed
        self._rings[key] = asyncio.create_task(self._ring(key, session, subscription))

    async def unsubscribe(self, connection: str, uri: str) -> None:
        await _stop(self._rings.pop((connection, uri), None))

    async def end(self, connection: str) -> None:
        """The connection ended: stop all of its doorbells (their push subscriptions are closed)."""
        for key in [k for k in self._rings if k[0] == connection]:
            await _stop(self._rings.pop(key, None))

    async def _ring(self, key: tuple[str, str], session: Any, subscription: Any) -> None:
        try:
            async for _ in subscription:
                await session.send_resource_updated(key[1])
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # noqa: BLE001 - the session went away, or delivery ended: stop ringing
            log.info("mcp.doorbell_stopped", uri=key[1][:200], reason=type(exc).__name__)
        finally:
            if self._rings.get(key) is asyncio.current_task():
                del self._rings[key]
            with contextlib.suppress(Exception):
                await asyncio.shield(subscription.close("unsubscribed"))

    def __len__(self) -> int:
        return len(self._rings)

    async def close(self) -> None:
        for key in list(self._rings):
            await _stop(self._rings.pop(key, None))


async def _stop(task: asyncio.Task[None] | None) -> None:
    if task is not None:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await task
