"""Export's reads (query.export): a scope's header, then its ledger entries page by page, each version with it.

A page is the scope's ledger rows after a position and up to the export's watermark, in ledger order, each
with the version it commits rendered exactly as history renders it (content null where erased, or hidden
by a later redaction; the tombstone marker on a deletion) and the salt of the content's digest where the
content is shown. Erased content is gone from the content store, so no page can carry it. With `vectors`, a
version whose content the page shows also carries the vectors every space holds for that very version, read
in the same snapshot as the page (a vector leaks its content: none goes with a version whose content is not
shown, and a vector naming a later version, or one past the watermark, is in no page). Pages are bounded
in rows and in bytes, so a reply fits a NATS message whatever the contents' sizes. memory_client.bundle
turns the pages into a bundle (schemas.bundle).
"""

from __future__ import annotations

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
from schemas.replies import envelope_bytes

PAGE_BYTES = 262_144  # a page stops growing past this (one entry at least): a reply stays far below 1 MiB
VALUE_BYTES = 16  # the most a vector's value takes in pgvector's text form ("-1.17549435e-38,")


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
    " CASE WHEN latest.hides AND latest.version_id <> v.version_id THEN NULL ELSE c.content END,"
    " CASE WHEN latest.hides AND latest.version_id <> v.version_id THEN NULL ELSE c.salt END"
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
    if not request.vectors:
        return await _entries_page(conn, request, partition, [])
    async with snapshot(conn):  # the versions and their vectors as of one moment
        return await _entries_page(conn, request, partition, await list_spaces(conn))


async def _entries_page(conn: psycopg.AsyncConnection[Any], request: ExportRequest, partition: int,
                        spaces: list[SpaceRow]) -> bytes:
    assert request.at_sequence is not None
    cur = await conn.execute(_ENTRIES, (request.scope_id, partition, request.after_sequence, request.at_sequence,
                                        request.limit))
    rows = await cur.fetchall()
    if not rows and not await scope_exists(conn, request.scope_id):  # asked only when a page comes back empty
        raise ScopeNotFound("scope not found", details={"scope_id": request.scope_id})
    entries: list[dict[str, Any]] = []
    size = 0
    per_vector = sum(space.dimensions * VALUE_BYTES for space in spaces)  # at most, for a shown version
    for seq, event, meta, content, salt in rows:
        entry: dict[str, Any] = {"ledger_sequence": seq, "event": msgspec.Raw(bytes(event))}
        size += len(event)
        if meta is not None:
            decoded = decode_json(bytes(meta))
            shown = bytes(content) if content is not None else None
            entry["envelope"] = msgspec.Raw(envelope_bytes(decoded, shown))
            if shown is not None and salt is not None and decoded.get("availability_state") != "deleted":
                entry["salt"] = bytes(salt).hex()
                size += per_vector
            size += len(meta) + len(shown or b"")
        entries.append(entry)
        if size >= PAGE_BYTES:
            break
    if spaces:
        await _attach_vectors(conn, request.scope_id, entries, spaces)
    last = entries[-1]["ledger_sequence"] if entries else request.at_sequence
    more = len(entries) < len(rows) or len(rows) == request.limit
    return canonical_bytes({"result": {"scope_id": request.scope_id, "entries": entries,
                                       "last_sequence": last, "more": more}})


async def _attach_vectors(conn: psycopg.AsyncConnection[Any], scope_id: str, entries: list[dict[str, Any]],
                          spaces: list[SpaceRow]) -> None:
    """Give each entry whose version's content is shown (it has its salt) the vectors of that version, space
    by space (one statement per space's table), each made from the version's own content digest."""
    shown: dict[tuple[str, str], tuple[dict[str, Any], str | None]] = {}
    for entry in entries:
        if "salt" in entry:
            event = decode_json(bytes(entry["event"]))
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
            entry.setdefault("vectors", []).append({
                "embedding_space_id": space.embedding_space_id, "space_digest": space.space_digest,
                "content_digest": digest, "vector": msgspec.Raw(text.encode())})
