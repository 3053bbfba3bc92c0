"""Snapshot comparison (PAMSPEC 18.11): what changed in one scope between two of its sealed snapshots.

Members follow each snapshot's rule (its named objects, or every object of the scope at its watermark,
deleted ones included: a tombstone is a version). An object is `added` when only the second snapshot (B)
holds it, `removed` when only the first (A) does, and `changed` when both hold it at different versions:
then it carries, in Inspect History's shape, the versions and the ledger events of that object between the
two watermarks (lower < ledger_sequence <= higher), oldest first, content rendered as history renders it
(null once erased or hidden by a later redaction: erasure wins). When A is later than B the diff is not
refused: `direction` is "backward" and the versions are those A holds beyond B.

A page is bounded in objects (`limit`) and in bytes, so a reply fits a NATS message whatever the scope's
size: `truncated` says there may be more, `after_object_id` is where the next page starts. An object whose
delta alone passes the byte bound is cut (a prefix in ledger order) and says so (`complete: false`); history
of that object at snapshot B has the rest. Every statement runs in one repeatable-read snapshot.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Annotated, Any, Literal

import msgspec
import psycopg

from infra.ledger import hidden_by_latest, latest_version
from query.export import PAGE_BYTES
from query.snapshot import snapshot
from query.snapshots import Pinned, pin_report, pinned
from schemas.canonical import canonical_bytes
from schemas.common import Id
from schemas.replies import stored_envelope_bytes

FETCH_ROWS = 8  # rows of one object's versions or events read at a time, until the page's byte bound
_ENTRY_BYTES = 128  # an entry's own field names, flags and brackets, beside its ids: more than they take

# Each object's version at each watermark (members only), those that differ, in object id order. Only the
# candidates can differ (`candidates`: objects with ledger entries between the watermarks, and those only one
# member list names), unless one snapshot holds every object and the other names some (`everything`).
_CANDIDATES = """(%(everything)s OR object_id IN (
    SELECT t.object_id FROM ledger t WHERE t.scope_id = %(scope)s AND t.partition = %(partition)s
      AND t.ledger_sequence > %(low)s AND t.ledger_sequence <= %(high)s AND t.object_id IS NOT NULL
    UNION SELECT unnest(%(named)s::text[])))"""
_MEMBERS = """WITH a AS (
  SELECT DISTINCT ON (object_id) object_id, version_id FROM memory_versions
  WHERE scope_id = %(scope)s AND ledger_sequence <= %(wa)s AND object_id > %(after)s
    AND (%(ma)s::text[] IS NULL OR object_id = ANY(%(ma)s::text[])) AND """ + _CANDIDATES + """
  ORDER BY object_id, sequence DESC
), b AS (
  SELECT DISTINCT ON (object_id) object_id, version_id FROM memory_versions
  WHERE scope_id = %(scope)s AND ledger_sequence <= %(wb)s AND object_id > %(after)s
    AND (%(mb)s::text[] IS NULL OR object_id = ANY(%(mb)s::text[])) AND """ + _CANDIDATES + """
  ORDER BY object_id, sequence DESC
)
SELECT object_id, a.version_id, b.version_id FROM a FULL JOIN b USING (object_id)
WHERE a.version_id IS DISTINCT FROM b.version_id ORDER BY object_id LIMIT %(limit)s"""
# One object's versions in the range, content null where erased or hidden by its latest version (history's rule).
_VERSIONS = (
    "SELECT v.ledger_sequence, v.meta, CASE WHEN " + hidden_by_latest("v") + " THEN NULL ELSE c.content END"
    " FROM memory_versions v LEFT JOIN content_store c ON c.content_digest = v.content_digest "
    + latest_version("v") +
    " WHERE v.scope_id = %s AND v.object_id = %s AND v.ledger_sequence > %s AND v.ledger_sequence <= %s"
    " ORDER BY v.sequence"
)
_EVENTS = ("SELECT ledger_sequence, event FROM ledger WHERE scope_id = %s AND object_id = %s"
           " AND ledger_sequence > %s AND ledger_sequence <= %s ORDER BY ledger_sequence")


class SnapshotDiffRequest(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Compare snapshot A (`from_snapshot_id`) with B (`to_snapshot_id`), both of `scope_id`; one page of
    objects after `after_object_id`."""

    scope_id: Id
    from_snapshot_id: Id
    to_snapshot_id: Id | None = None  # absent: `scope_id` is an evaluation scope, compared as it reads now
    after_object_id: Id | None = None
    limit: Annotated[int, msgspec.Meta(ge=1, le=1000)] = 100
    operation_id: Annotated[str, msgspec.Meta(max_length=512)] | None = None


@dataclass
class _Page:
    """One reply's objects, within PAGE_BYTES (the first always goes in, cut if it must be)."""

    added: list[dict[str, Any]] = field(default_factory=list)
    removed: list[dict[str, Any]] = field(default_factory=list)
    changed: list[dict[str, Any]] = field(default_factory=list)
    size: int = 0
    last: str | None = None
    full: bool = False

    def fits(self, size: int) -> bool:
        return self.last is None or self.size + size <= PAGE_BYTES

    def add(self, into: list[dict[str, Any]], item: dict[str, Any], size: int) -> None:
        into.append(item)
        self.size += size
        self.last = item["object_id"]


async def snapshot_diff(conn: psycopg.AsyncConnection[Any], request: SnapshotDiffRequest) -> bytes:
    """One page of the comparison of two sealed snapshots of one scope (module docstring)."""
    async with snapshot(conn):
        a = await pinned(conn, request.scope_id, request.from_snapshot_id)
        assert request.to_snapshot_id is not None  # else query.eval_diff answers
        b = await pinned(conn, request.scope_id, request.to_snapshot_id)
        low, high = sorted((a.watermark, b.watermark))
        everything = (a.members is None) != (b.members is None)
        named = sorted(set(a.members or ()) ^ set(b.members or ()))
        cur = await conn.execute(_MEMBERS, {
            "scope": request.scope_id, "after": request.after_object_id or "", "limit": request.limit,
            "wa": a.watermark, "ma": a.members, "wb": b.watermark, "mb": b.members, "everything": everything,
            "partition": 0, "low": low, "high": high, "named": named})
        rows = await cur.fetchall()
        page = await fill_page(rows, lambda row, budget, cut: _changed(
            conn, request.scope_id, row[0], (row[1], row[2]), (low, high), budget, cut))
        reports = {"from": await pin_report(conn, a), "to": await pin_report(conn, b)}
    return canonical_bytes({"result": {
        "scope_id": request.scope_id, **reports, "direction": _direction(a, b),
        "added": page.added, "removed": page.removed, "changed": page.changed,
        "truncated": page.full or len(rows) == request.limit, "after_object_id": page.last}})


ChangedEntry = Callable[[Any, int, bool], Awaitable[tuple[dict[str, Any], int] | None]]


async def fill_page(rows: list[Any], changed: ChangedEntry) -> _Page:
    """One page from member rows (object_id, version in A, version in B, ...): an object only one side holds
    is added or removed; one both hold at different versions gets `changed(row, budget, cut)`'s entry, while
    it fits the page's byte bound (the page's first entry is cut to fit, never dropped)."""
    page = _Page()
    for row in rows:
        object_id, in_a, in_b = row[0], row[1], row[2]
        if in_a is None or in_b is None:
            item = {"object_id": object_id, "version_id": in_b if in_a is None else in_a}
            size = len(canonical_bytes(item)) + 1
            if not page.fits(size):
                page.full = True
                break
            page.add(page.added if in_a is None else page.removed, item, size)
            continue
        found = await changed(row, PAGE_BYTES - page.size, page.last is None)
        if found is None:
            page.full = True
            break
        page.add(page.changed, *found)
    return page


def _direction(a: Pinned, b: Pinned) -> Literal["forward", "backward"]:
    return "forward" if a.watermark <= b.watermark else "backward"


async def _changed(conn: psycopg.AsyncConnection[Any], scope_id: str, object_id: str, held: tuple[str, str],
                   span: tuple[int, int], budget: int, cut: bool) -> tuple[dict[str, Any], int] | None:
    """A changed object's entry and its size: its versions and events within `span`, if they fit `budget`;
    else, for the page's first object (`cut`), the longest prefix in ledger order that fits, else None. What
    is read stops soon after the budget is passed, so no object's history is ever held whole."""
    own = _ENTRY_BYTES + len(object_id) + len(held[0]) + len(held[1])
    params = (scope_id, object_id, *span)
    versions, whole_v = await _read(conn, "diff_versions", _VERSIONS, params, budget - own, _version)
    events, whole_e = await _read(conn, "diff_events", _EVENTS, params, budget - own, _event)
    size = own + sum(len(body) for _, body in versions) + sum(len(body) for _, body in events)
    complete = whole_v and whole_e and size <= budget
    if not complete:
        if not cut:
            return None
        versions, events, size = prefix_within(versions, events, budget, own)
    entry = {"object_id": object_id, "from_version_id": held[0], "to_version_id": held[1],
             "versions": [msgspec.Raw(body) for _, body in versions],
             "events": [msgspec.Raw(body) for _, body in events], "complete": complete}
    return entry, size


def _version(seq: int, meta: bytes, content: bytes | None) -> bytes:
    return stored_envelope_bytes(bytes(meta), bytes(content) if content is not None else None)[0]


def _event(seq: int, event: bytes) -> bytes:
    return b'{"event":' + bytes(event) + b',"ledger_sequence":' + str(seq).encode() + b"}"


async def _read(conn: psycopg.AsyncConnection[Any], name: str, statement: str, params: tuple[Any, ...],
                budget: int, render: Callable[..., bytes]) -> tuple[list[tuple[int, bytes]], bool]:
    """(ledger_sequence, rendered bytes) of the statement's rows in order, until their size passes `budget`;
    and whether every row was read. A few rows come in one round trip; more, through a cursor."""
    found: list[tuple[int, bytes]] = []
    size = 0

    def take(rows: list[Any]) -> bool:
        nonlocal size
        for row in rows:
            found.append((int(row[0]), render(*row)))
            size += len(found[-1][1]) + 1
            if size > budget:
                return False
        return True

    first = await (await conn.execute(statement + " LIMIT %s", (*params, FETCH_ROWS + 1))).fetchall()
    if len(first) <= FETCH_ROWS:  # most objects change a few times between two snapshots
        return found, take(first)
    async with conn.cursor(name) as cur:
        await cur.execute(statement, params)
        while rows := await cur.fetchmany(FETCH_ROWS):
            if not take(rows):
                return found, False
    return found, True


def prefix_within(versions: list[tuple[int, bytes]], events: list[tuple[int, bytes]], budget: int,
                  size: int) -> tuple[list[tuple[int, bytes]], list[tuple[int, bytes]], int]:
    """The longest prefix in ledger order (versions and events together) within `budget`, at least one row."""
    merged = sorted([(seq, 0, v) for seq, v in versions] + [(seq, 1, e) for seq, e in events],
                    key=lambda row: (row[0], row[1]))
    kept_v: list[tuple[int, bytes]] = []
    kept_e: list[tuple[int, bytes]] = []
    for seq, kind, body in merged:
        if (kept_v or kept_e) and size + len(body) + 1 > budget:
            break
        (kept_v if kind == 0 else kept_e).append((seq, body))
        size += len(body) + 1
    return kept_v, kept_e, size
