"""What the writer's core knows about an object: its head version, as plain data."""

from __future__ import annotations

from datetime import datetime
from typing import Any

import msgspec


class ObjectHead(msgspec.Struct, frozen=True, kw_only=True):
    """The latest version of one object: its envelope metadata (no content) and content digest."""

    scope_id: str
    object_id: str
    version_id: str
    sequence: int
    meta: dict[str, Any]
    content_digest: str | None

    @property
    def deleted(self) -> bool:
        return bool(self.meta["availability_state"] == "deleted")

    def state(self, dimension: str) -> str:
        return str(self.meta[f"{dimension}_state"])


class Stamp(msgspec.Struct, frozen=True, kw_only=True):
    """Ids and time the shell hands the core, so the core has no clock or uuid of its own."""

    operation_id: str
    event_id: str
    version_id: str
    object_id: str
    now: datetime
    salt: bytes


class Decision(msgspec.Struct, frozen=True, kw_only=True):
    """What one accepted command does: one ledger event, the version it commits, content to store or erase."""

    event: Any  # schemas.events.LedgerEvent
    head: ObjectHead | None  # None for event-only ledger entries (no Memory Version)
    content: bytes | None = None
    erase_content: bool = False
    result: dict[str, Any] | None = None  # an event-only entry's own result fields (a delegation's grant)
