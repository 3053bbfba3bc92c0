"""Export's reads (query.export): a scope's header, then its ledger entries page by page, each version with it.

A page is the scope's ledger rows after a position and up to the export's watermark, in ledger order, each
with the version it commits rendered exactly as history renders it (content null where erased, or hidden
by a later redaction; the tombstone marker on a deletion) and the salt of the content's digest where the
content is shown. Erased content is gone from the content store, so no page can carry it. Pages are bounded
in rows and in bytes, so a reply fits a NATS message whatever the contents' sizes. A page carries its entries
as the bundle's lines (schemas.bundle), rendered around the event's stored bytes and the envelope's bytes as history
renders them, neither decoded again; memory_client.bundle writes them as they come.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

import msgspec
import psycopg

from embedding.store import list_spaces
from infra.ledger import HEAD, hidden_by_latest, latest_version
from infra.ledger_identity import IDENTITY
from infra.scopes import scope_exists, scope_record
from schemas.canonical import canonical_bytes
from schemas.common import Id
from schemas.embedding import space_digest
from schemas.errors import InvalidRequest, ScopeNotFound
from schemas.bundle import event_line, version_line
from schemas.replies import stored_envelope_bytes

PAGE_BYTES = 786_432  # a page's lines stay within this (or are one entry): a reply fits 1 MiB with room for its
# own few fields, and an entry alone is at most the writer's 512 KiB command with its event
FETCH_ROWS = 64  # rows of a page's first read from its cursor


class ExportRequest(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """part "header": the scope's record, the ledger's id and head, the registered spaces; part "entries":
    one page of entries after `after_sequence`, up to `at_sequence` (required: the header's watermark)."""

    scope_id: Id
    part: Literal["header", "entries"] = "entries"
    at_sequence: Annotated[int, msgspec.Meta(ge=0, le=2**63 - 1)] | None = None
    after_sequence: Annotated[int, msgspec.Meta(ge=0, le=2**63 - 1)] = 0
    limit: Annotated[int, msgspec.Meta(ge=1, le=2000)] = 500
    operation_id: Annotated[str, msgspec.Meta(max_length=512)] | None = None


# Each ledger row of the scope, the version it commits and that version's stored content, shown unless the
# object's latest version hides it (the test infra.ledger.hidden_by_latest makes, on the LATERAL `latest`).
_ENTRIES = (
    "SELECT l.ledger_sequence, l.event, v.meta,"
    " CASE WHEN CASE WHEN latest.version_id <> v.version_id THEN convert_from(latest.meta, 'UTF8')::jsonb"
    " ->> 'availability_state' IN ('redacted', 'partially_redacted') ELSE false END THEN NULL ELSE c.content END,"
    " CASE WHEN CASE WHEN latest.version_id <> v.version_id THEN convert_from(latest.meta, 'UTF8')::jsonb"
    " ->> 'availability_state' IN ('redacted', 'partially_redacted') ELSE false END THEN NULL ELSE c.salt END"
    " FROM ledger l LEFT JOIN memory_versions v ON v.version_id = l.version_id"
    " LEFT JOIN content_store c ON c.content_digest = v.content_digest "
) + latest_version("v", outer=True) + (
    " WHERE l.scope_id = %s AND l.partition = %s AND l.ledger_sequence > %s AND l.ledger_sequence <= %s"
    " ORDER BY l.ledger_sequence LIMIT %s"
)
assert hidden_by_latest("v") in _ENTRIES


async def export_header(conn: psycopg.AsyncConnection[Any], request: ExportRequest, partition: int) -> bytes:
    scope = await scope_record(conn, request.scope_id)
    if scope is None:
        raise ScopeNotFound("scope not found", details={"scope_id": request.scope_id})
    row = await (await conn.execute(f"SELECT {IDENTITY}, {HEAD}", (partition, partition))).fetchone()
    assert row is not None
    ledger_id, head = row
    at = head if request.at_sequence is None else request.at_sequence
    if at > head:
        raise InvalidRequest("at_sequence is past the ledger's head", details={"at_sequence": at, "head": head})
    spaces = [{"embedding_space": msgspec.to_builtins(space.descriptor), "space_digest": space_digest(space.descriptor)}
              for space in await list_spaces(conn)]
    return canonical_bytes({"result": {"scope": scope, "source_ledger_id": ledger_id, "watermark": at,
                                       "head": head, "embedding_spaces": spaces}})


async def export_entries(conn: psycopg.AsyncConnection[Any], request: ExportRequest, partition: int) -> bytes:
    if request.at_sequence is None:
        raise InvalidRequest("an entries page names the export's at_sequence (the header's watermark)")
    page = _Page()
    # A cursor, read in a few steps sized to what the page still holds: the rows past the page's byte bound are
    # never computed or sent (with LIMIT alone, Postgres and this process did the whole limit's work for the
    # page's first rows).
    async with conn.transaction(), conn.cursor("export_entries", binary=True) as cur:
        await cur.execute(_ENTRIES, (request.scope_id, partition, request.after_sequence, request.at_sequence,
                                     request.limit))
        while not page.full and (rows := await cur.fetchmany(page.wanted())):
            for row in rows:
                if not page.add(*row):
                    break
    if not page.rows and not await scope_exists(conn, request.scope_id):  # asked only when a page comes back empty
        raise ScopeNotFound("scope not found", details={"scope_id": request.scope_id})
    last = page.last if page.lines else request.at_sequence
    more = page.full or page.rows == request.limit
    return canonical_bytes({"result": {"scope_id": request.scope_id, "lines": page.lines, "versions": page.versions,
                                       "events": page.events, "last_sequence": last, "more": more}})


class _Page:
    """One page's bundle lines (schemas.bundle), rendered from the stored bytes without decoding them, and
    bounded: a line pair that would take the page past PAGE_BYTES waits for the next page (the first always
    goes in, so a page makes progress whatever one entry's size)."""

    def __init__(self) -> None:
        self.lines: list[msgspec.Raw] = []
        self.size = self.rows = self.versions = self.events = self.last = 0
        self.full = False

    def wanted(self) -> int:
        """The rows to read next: FETCH_ROWS first, then about what the rest of the byte bound holds at the
        mean size so far, and a few more, so a page takes two or three reads and leaves few rows unused."""
        if not self.rows:
            return FETCH_ROWS
        return max(8, int((PAGE_BYTES - self.size) * self.rows / self.size) + 8)

    def add(self, seq: int, event: bytes, meta: bytes | None, content: bytes | None, salt: bytes | None) -> bool:
        pair = [event_line(seq, event)]
        if meta is not None:
            envelope, deleted = stored_envelope_bytes(meta, content)
            salt_hex = bytes(salt).hex() if content is not None and salt is not None and not deleted else None
            pair.insert(0, version_line(seq, envelope, salt_hex))
        size = sum(len(line) + 1 for line in pair)
        if self.lines and self.size + size > PAGE_BYTES:
            self.full = True
            return False
        self.lines.extend(msgspec.Raw(line) for line in pair)
        self.size += size
        self.rows += 1
        self.versions += len(pair) - 1
        self.events += 1
        self.last = seq
        return True
