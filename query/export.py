"""Export's reads (query.export): a scope's header, then its ledger entries page by page, each version with it.

A page is the scope's ledger rows after a position and up to the export's watermark, in ledger order, each
with the version it commits rendered exactly as history renders it (content null where erased, or hidden
by a later redaction; the tombstone marker on a deletion) and the salt of the content's digest where the
content is shown. Erased content is gone from the content store, so no page can carry it. With `vectors`, a
version whose content the page shows also carries the vectors every space holds for that very version, read
in the same snapshot as the page (a vector leaks its content: none goes with a version whose content is not
shown, and a vector naming a later version, or one past the watermark, is in no page). Pages are bounded
in rows and in bytes, so a reply fits a NATS message whatever the contents' sizes. A page carries its entries
as the bundle's lines (schemas.bundle), rendered around the event's stored bytes and the envelope's bytes as history
renders them, neither decoded again, each version's vector lines after its event's; pamledger.bundle writes
them as they come.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Annotated, Any, Literal

import msgspec
import psycopg

from embedding.store import SpaceRow, list_spaces, version_vectors
from infra.ledger import HEAD, hidden_by_latest, latest_version
from infra.ledger_identity import IDENTITY
from infra.scopes import scope_exists, scope_record
from query.snapshot import snapshot
from schemas.canonical import canonical_bytes, decode_json
from schemas.common import Id
from schemas.embedding import space_digest
from schemas.errors import InvalidRequest, ScopeNotFound
from schemas.bundle import event_line, vector_line, version_line
from schemas.replies import stored_envelope_bytes

PAGE_BYTES = 786_432  # a page's lines stay within this (or are one entry): a reply fits 1 MiB with room for its
# own few fields, and an entry alone is at most the writer's 512 KiB command with its event (and its vectors)
FETCH_ROWS = 64  # rows of a page's first read from its cursor


class ExportRequest(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """part "header": the scope's record, the ledger's id and head, the registered spaces; part "entries":
    one page of entries after `after_sequence`, up to `at_sequence` (required: the header's watermark)."""

    scope_id: Id
    part: Literal["header", "entries"] = "entries"
    at_sequence: Annotated[int, msgspec.Meta(ge=0, le=2**63 - 1)] | None = None
    after_sequence: Annotated[int, msgspec.Meta(ge=0, le=2**63 - 1)] = 0
    limit: Annotated[int, msgspec.Meta(ge=1, le=2000)] = 500
    vectors: bool = False  # each shown version with the vectors of it (schemas.bundle.VectorLine)
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
    # A cursor, read in a few steps sized to what the page still holds: the rows past the page's byte bound are
    # never computed or sent (with LIMIT alone, Postgres and this process did the whole limit's work for the
    # page's first rows). With vectors, the rows and their vectors are read in one snapshot.
    async with snapshot(conn) if request.vectors else conn.transaction():
        page = _Page(await list_spaces(conn) if request.vectors else [])
        async with conn.cursor("export_entries", binary=True) as cur:
            await cur.execute(_ENTRIES, (request.scope_id, partition, request.after_sequence, request.at_sequence,
                                         request.limit))
            while not page.full and (rows := await cur.fetchmany(page.wanted())):
                if page.spaces:  # each row's vectors before its lines are measured against the byte bound
                    entries: Iterable[_Entry] = [page.render(*row) for row in rows]
                    await _attach_vectors(conn, request.scope_id, page.spaces, entries)
                else:
                    entries = (page.render(*row) for row in rows)  # rendered one at a time, up to the bound
                for entry in entries:
                    if not page.add(entry):
                        break
    if not page.rows and not await scope_exists(conn, request.scope_id):  # asked only when a page comes back empty
        raise ScopeNotFound("scope not found", details={"scope_id": request.scope_id})
    last = page.last if page.lines else request.at_sequence
    more = page.full or page.rows == request.limit
    return canonical_bytes({"result": {"scope_id": request.scope_id, "lines": page.lines, "versions": page.versions,
                                       "events": page.events, "vectors": page.vectors, "last_sequence": last,
                                       "more": more}})


class _Entry:
    """One ledger row's bundle lines: its version's (if it commits one), its event's, then its vectors'. `shown`
    is the event's stored bytes where the version's content is shown (it has its salt): only then vectors."""

    __slots__ = ("seq", "lines", "version", "shown", "vectors")

    def __init__(self, seq: int, lines: list[bytes], version: bool, shown: bytes | None) -> None:
        self.seq, self.lines, self.version, self.shown, self.vectors = seq, lines, version, shown, 0


class _Page:
    """One page's bundle lines (schemas.bundle), rendered from the stored bytes without decoding them, and
    bounded: an entry's lines (its vectors' included) that would take the page past PAGE_BYTES wait for the
    next page (the first always goes in, so a page makes progress whatever one entry's size)."""

    def __init__(self, spaces: list[SpaceRow]) -> None:
        self.spaces = spaces
        self.lines: list[msgspec.Raw] = []
        self.size = self.rows = self.versions = self.events = self.vectors = self.last = 0
        self.full = False

    def wanted(self) -> int:
        """The rows to read next: FETCH_ROWS first, then about what the rest of the byte bound holds at the
        mean size so far, and a few more, so a page takes two or three reads and leaves few rows unused."""
        if not self.rows:
            return FETCH_ROWS
        return max(8, int((PAGE_BYTES - self.size) * self.rows / self.size) + 8)

    @staticmethod
    def render(seq: int, event: bytes, meta: bytes | None, content: bytes | None, salt: bytes | None) -> _Entry:
        lines = [event_line(seq, event)]
        if meta is None:
            return _Entry(seq, lines, False, None)
        envelope, deleted = stored_envelope_bytes(meta, content)
        salt_hex = bytes(salt).hex() if content is not None and salt is not None and not deleted else None
        lines.insert(0, version_line(seq, envelope, salt_hex))
        return _Entry(seq, lines, True, event if salt_hex is not None else None)

    def add(self, entry: _Entry) -> bool:
        size = sum(len(line) + 1 for line in entry.lines)
        if self.lines and self.size + size > PAGE_BYTES:
            self.full = True
            return False
        self.lines.extend(msgspec.Raw(line) for line in entry.lines)
        self.size += size
        self.rows += 1
        self.versions += entry.version
        self.events += 1
        self.vectors += entry.vectors
        self.last = entry.seq
        return True


async def _attach_vectors(conn: psycopg.AsyncConnection[Any], scope_id: str, spaces: list[SpaceRow],
                          entries: Iterable[_Entry]) -> None:
    """Give each entry whose version's content is shown the vector lines of that version, space by space (one
    statement per space's table), each made from the version's own content digest."""
    shown: dict[tuple[str, str], tuple[_Entry, Any]] = {}
    for entry in entries:
        if entry.shown is not None:
            event = decode_json(bytes(entry.shown))
            name, version_id = event.get("object_id"), event.get("version_id")
            if isinstance(name, str) and isinstance(version_id, str):
                shown[(name, version_id)] = (entry, (event.get("payload") or {}).get("content_digest"))
    if not shown:
        return
    for space in spaces:
        for object_id, version_id, made_from, text in await version_vectors(conn, space, scope_id, sorted(shown)):
            entry, digest = shown[(object_id, version_id)]
            if digest is None or made_from not in (None, digest):
                continue  # not made from this version's content
            entry.lines.append(vector_line(entry.seq, object_id, version_id, digest, space.embedding_space_id,
                                           space.space_digest, text.encode()))
            entry.vectors += 1
