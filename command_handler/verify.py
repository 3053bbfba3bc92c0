"""`pamledger verify`: check every stored column against the hash chain, and the head against the stream.

Why: the chain alone covers each row's sequence and event bytes, so an edit of a column outside them
(`ledger.scope_id`, a version's `meta`, stored content), or deleting the last rows, went unseen. Here each
column is either hashed or compared with what the hash covers, in one streamed pass, and the head is
anchored outside the table: the JetStream replica's last message must be this ledger's row at that sequence.
"""

from __future__ import annotations

import asyncio
import hashlib
import time
from collections.abc import Callable, Iterable, Iterator
from datetime import datetime
from typing import Any

import msgspec
import nats
import psycopg
from nats.js.errors import NotFoundError

from command_handler.core.chain import GENESIS_HASH, row_hash
from infra.ledger import HEAD
from infra.ledger_identity import IDENTITY, stream_ledger_id
from infra.nats_log import ConnectionLog
from infra.nats_servers import server_urls

Progress = Callable[[dict[str, Any]], None]
PROGRESS_SECONDS = 0.5

_decode = msgspec.json.Decoder()
# One pass in ledger order: each row with the version it committed and, for the events that brought new
# content (create, update), that content. Transitions share their predecessor's digest: its content is
# checked once, with the event that wrote it. Content may be missing only once a later event erased the
# object (delete, an availability transition to redacted, or an erasing redaction), or once a later redaction
# suppressed it in a scope an import then wrote (an export never carries suppressed content, so the import had
# none to store: docs/protocol.md, "Export and import"): the last column says so. It is
# computed only for new content that is missing (NULL otherwise), from the erasing rows' event_type, which
# the same pass checks against their hashed events.
# Events whose version brought new content (a partial redaction brings its projection).
_NEW_CONTENT = "('object_created', 'object_updated', 'relationship_created', 'relationship_updated', 'object_redacted')"
_ROWS_SQL = """
SELECT l.ledger_sequence, l.event, l.prev_hash, l.row_hash, l.event_id, l.operation_id, l.scope_id,
       l.object_id, l.version_id, l.event_type, l.recorded_at,
       v.version_id, v.scope_id, v.object_id, v.sequence, v.ledger_sequence, v.meta, v.content_digest,
       c.content_digest, c.scope_id, c.object_id, c.salt, c.content,
       CASE WHEN c.content_digest IS NULL AND v.content_digest IS NOT NULL
                 AND l.event_type IN """ + _NEW_CONTENT + """
            THEN EXISTS (SELECT 1 FROM ledger e WHERE e.scope_id = l.scope_id AND e.object_id = l.object_id
                         AND e.ledger_sequence > l.ledger_sequence AND e.partition = l.partition
                         AND (e.event_type = 'object_deleted'
                              OR (e.event_type = 'availability_transitioned'
                                  AND convert_from(e.event, 'UTF8')::jsonb #>> '{payload,to}' IN ('redacted', 'deleted'))
                              OR (e.event_type = 'object_redacted'
                                  AND convert_from(e.event, 'UTF8')::jsonb #>> '{payload,redaction,erased}' = 'true')
                              OR (e.event_type = 'object_redacted' AND EXISTS (SELECT 1 FROM ledger i
                                  WHERE i.scope_id = l.scope_id AND i.partition = l.partition
                                  AND i.ledger_sequence > e.ledger_sequence AND i.event_type = 'index_rebuilt'
                                  AND convert_from(i.event, 'UTF8')::jsonb #>> '{payload,action}' = 'scope_imported'))))
       END
FROM ledger l
LEFT JOIN memory_versions v ON v.version_id = l.version_id
LEFT JOIN content_store c ON c.content_digest = v.content_digest
     AND l.event_type IN """ + _NEW_CONTENT + """
WHERE l.partition = %s ORDER BY l.ledger_sequence"""


def _own(rows: str) -> str:
    """SQL: `rows` (a SELECT of a table with a scope_id, aliased o) narrowed to the partition verified
    (`%(p)s`): those of the scopes created there (infra.partitions; rows of a scope without a row of its own,
    as the system scope's, are partition 0's)."""
    return ("(" + rows + " WHERE coalesce((SELECT ps.partition FROM scopes ps WHERE ps.scope_id = o.scope_id), 0)"
            " = %(p)s)")


# Rows of the other tables that no ledger row accounts for (checked after the pass, which vouches for
# every ledger column they are compared with). Each: (check, SQL returning (ledger_sequence, what)).
_ORPHAN_CHECKS = (
    ("memory_versions.ledger_row",
     "SELECT v.ledger_sequence, v.version_id FROM " + _own("SELECT o.* FROM memory_versions o") +
     " v WHERE NOT EXISTS (SELECT 1 FROM ledger l"
     " WHERE l.partition = %(p)s AND l.ledger_sequence = v.ledger_sequence AND l.version_id = v.version_id)"
     " ORDER BY v.ledger_sequence LIMIT 1"),
    ("content_store.version",
     "SELECT NULL::bigint, c.content_digest FROM content_store c WHERE NOT EXISTS (SELECT 1 FROM"
     " memory_versions v WHERE v.content_digest = c.content_digest AND v.scope_id = c.scope_id"
     " AND v.object_id = c.object_id) LIMIT 1"),
    ("idempotency_records.ledger_row",
     "SELECT r.ledger_sequence, r.idempotency_key FROM " + _own("SELECT o.* FROM idempotency_records o") +
     " r LEFT JOIN ledger l"
     " ON l.partition = %(p)s AND l.ledger_sequence = r.ledger_sequence"
     " WHERE l.event_id IS NULL OR l.scope_id <> r.scope_id OR l.object_id IS DISTINCT FROM r.object_id"
     " OR l.version_id IS DISTINCT FROM r.version_id ORDER BY r.ledger_sequence LIMIT 1"),
)
# The writer's delegation state (migration 009) against the ledger's delegation entries, both ways: each row's
# grant, uses and revocation are what its delegation_granted / _exercised / _revoked entries say, and every
# delegation_granted has its row. (The chain pass above has vouched for those entries' bytes.)
_DELEGATION_EVENTS = """(SELECT l.ledger_sequence, l.event_type, convert_from(l.event, 'UTF8')::jsonb -> 'payload' AS p
   FROM ledger l WHERE l.partition = %(p)s
   AND l.event_type IN ('delegation_granted', 'delegation_exercised', 'delegation_revoked'))"""
_DELEGATION_CHECKS = (
    ("delegations.ledger_entries",
     "SELECT NULL::bigint, d.delegation_id FROM " + _own("SELECT o.* FROM delegations o") +
     " d LEFT JOIN LATERAL (SELECT"
     " count(*) FILTER (WHERE e.event_type = 'delegation_exercised') AS uses,"
     " coalesce(bool_or(e.event_type = 'delegation_revoked'), false) AS revoked,"
     " (array_agg(e.p -> 'delegation') FILTER (WHERE e.event_type = 'delegation_granted'))[1] AS granted"
     " FROM " + _DELEGATION_EVENTS + " e WHERE coalesce(e.p ->> 'delegation_id', e.p -> 'delegation' ->> 'delegation_id')"
     " = d.delegation_id) f ON true"
     " WHERE f.granted IS NULL OR f.granted <> convert_from(d.grant_object, 'UTF8')::jsonb OR f.uses <> d.uses"
     " OR f.revoked <> d.revoked ORDER BY d.delegation_id LIMIT 1"),
    ("delegations.row",
     "SELECT e.ledger_sequence, e.p -> 'delegation' ->> 'delegation_id' FROM " + _DELEGATION_EVENTS + " e"
     " WHERE e.event_type = 'delegation_granted' AND NOT EXISTS (SELECT 1 FROM delegations d"
     " WHERE d.delegation_id = e.p -> 'delegation' ->> 'delegation_id') ORDER BY e.ledger_sequence LIMIT 1"),
)
# Each sealed snapshot's row is its snapshot_sealed entry's descriptor, at the entry's sequence and scope, and
# every such entry has its row (rows carry no partition of their own: their scope's, _own).
_SNAPSHOT_ENTRIES = """(SELECT l.ledger_sequence, l.scope_id, convert_from(l.event, 'UTF8')::jsonb -> 'payload' AS p
   FROM ledger l WHERE l.partition = %(p)s AND l.event_type = 'index_rebuilt'
   AND convert_from(l.event, 'UTF8')::jsonb #>> '{payload,action}' = 'snapshot_sealed')"""
_SNAPSHOT_CHECKS = (
    ("evaluation_snapshots.ledger_entry",
     "SELECT s.ledger_sequence, s.snapshot_id FROM " + _own("SELECT o.* FROM evaluation_snapshots o") +
     " s LEFT JOIN " + _SNAPSHOT_ENTRIES +
     " e ON e.ledger_sequence = s.ledger_sequence WHERE e.p IS NULL OR e.scope_id <> s.scope_id"
     " OR e.p -> 'snapshot' <> convert_from(s.descriptor, 'UTF8')::jsonb ORDER BY s.ledger_sequence LIMIT 1",
     "its row is not its ledger entry's descriptor"),
    ("evaluation_snapshots.row",
     "SELECT e.ledger_sequence, e.p -> 'snapshot' ->> 'snapshot_id' FROM " + _SNAPSHOT_ENTRIES + " e"
     " WHERE NOT EXISTS (SELECT 1 FROM evaluation_snapshots s WHERE s.ledger_sequence = e.ledger_sequence"
     " AND s.scope_id = e.scope_id)"
     " ORDER BY e.ledger_sequence LIMIT 1", "it is sealed in the ledger but has no row"),
)
# Each evaluation run's row is its evaluation_started entry (scope, run id, the record's snapshot, base and
# watermark) and, once ended, its evaluation_ended entry; every evaluation_started entry has its row.
_RUN_ENTRIES = """(SELECT l.ledger_sequence, l.scope_id, convert_from(l.event, 'UTF8')::jsonb -> 'payload' AS p
   FROM ledger l WHERE l.partition = %(p)s AND l.event_type = 'index_rebuilt'
   AND convert_from(l.event, 'UTF8')::jsonb #>> '{payload,action}' = '{action}')"""
_RUN_CHECKS = (
    ("evaluation_runs.started_entry",
     "SELECT r.started_sequence, r.evaluation_run_id FROM " + _own("SELECT o.* FROM evaluation_runs o") + " r LEFT JOIN "
     + _RUN_ENTRIES.replace("{action}", "evaluation_started") + " e ON e.ledger_sequence = r.started_sequence"
     " CROSS JOIN LATERAL (SELECT convert_from(r.record, 'UTF8')::jsonb AS rec) x"
     " WHERE e.p IS NULL OR e.scope_id <> r.scope_id OR e.p ->> 'evaluation_run_id' <> r.evaluation_run_id"
     " OR x.rec ->> 'run_id' <> r.evaluation_run_id OR x.rec ->> 'scope_id' <> r.scope_id"
     " OR x.rec ->> 'snapshot_id' <> e.p ->> 'snapshot_id' OR x.rec ->> 'base_scope_id' <> e.p ->> 'base_scope_id'"
     " OR (x.rec ->> 'watermark')::bigint <> (e.p ->> 'ledger_sequence_high_watermark')::bigint"
     " ORDER BY r.started_sequence LIMIT 1", "its row is not its evaluation_started entry"),
    ("evaluation_runs.ended_entry",
     "SELECT coalesce(r.ended_sequence, e.ledger_sequence), r.evaluation_run_id FROM "
     + _own("SELECT o.* FROM evaluation_runs o") +
     " r FULL JOIN "
     + _RUN_ENTRIES.replace("{action}", "evaluation_ended") + " e ON e.ledger_sequence = r.ended_sequence"
     " WHERE (r.ended_sequence IS NOT NULL OR e.ledger_sequence IS NOT NULL)"
     " AND (r.scope_id IS NULL OR e.scope_id IS NULL OR e.scope_id <> r.scope_id)"
     " ORDER BY 1 LIMIT 1", "its row and its evaluation_ended entry disagree"),
    ("evaluation_runs.row",
     "SELECT e.ledger_sequence, e.p ->> 'evaluation_run_id' FROM "
     + _RUN_ENTRIES.replace("{action}", "evaluation_started") + " e"
     " WHERE NOT EXISTS (SELECT 1 FROM evaluation_runs r WHERE r.started_sequence = e.ledger_sequence"
     " AND r.scope_id = e.scope_id)"
     " ORDER BY e.ledger_sequence LIMIT 1", "it is started in the ledger but has no row"),
)
_LEDGER_COLUMNS = ("event_id", "operation_id", "scope_id", "object_id", "version_id", "event_type")


class Bad(Exception):
    """One failed check: the row's ledger sequence, the check's name (table.column) and why."""

    def __init__(self, sequence: int | None, check: str, reason: str):
        super().__init__(reason)
        self.sequence, self.check, self.reason = sequence, check, reason


def verify_rows(rows: Iterable[tuple[Any, ...]]) -> dict[str, Any]:
    """rows: _ROWS_SQL's columns in ledger order (or just the first four: sequence, event, prev_hash,
    row_hash, for the chain alone). Pure, so tests can feed it."""
    expected_prev, expected_seq, count = GENESIS_HASH, 1, 0
    try:
        for row in rows:
            seq, event, prev, stored = row[0], bytes(row[1]), bytes(row[2]), bytes(row[3])
            check_chain(seq, event, prev, stored, expected_seq, expected_prev)
            if len(row) > 4:
                check_columns(seq, row)
            expected_prev, expected_seq, count = stored, seq + 1, count + 1
    except Bad as bad:
        return failure(bad, count)
    return {"ok": True, "rows_checked": count, "head_sequence": expected_seq - 1, "head_hash": expected_prev.hex()}


def failure(bad: Bad, count: int) -> dict[str, Any]:
    return {"ok": False, "rows_checked": count, "first_bad_sequence": bad.sequence, "check": bad.check,
            "reason": bad.reason}


def check_chain(seq: int, event: bytes, prev: bytes, stored: bytes, expected_seq: int, expected_prev: bytes) -> None:
    if seq != expected_seq:
        raise Bad(seq, "ledger.ledger_sequence", f"sequence gap: expected {expected_seq}, found {seq}")
    if prev != expected_prev:
        raise Bad(seq, "ledger.prev_hash", "prev_hash does not match the previous row's hash")
    if row_hash(prev, seq, event) != stored:
        raise Bad(seq, "ledger.row_hash", "row_hash does not match the row's bytes")


def check_columns(seq: int, row: tuple[Any, ...]) -> None:
    """The ledger row's own columns, its version and its new content, against the (hashed) event."""
    try:
        event = _decode.decode(bytes(row[1]))
    except msgspec.DecodeError:
        raise Bad(seq, "ledger.event", "the event bytes are not JSON") from None
    for name, value in zip(_LEDGER_COLUMNS, row[4:10]):
        if _named(event, name) != value:
            raise Bad(seq, f"ledger.{name}", f"ledger.{name} differs from the event's {name}")
    if _timestamp(event.get("recorded_at")) != row[10]:
        raise Bad(seq, "ledger.recorded_at", "ledger.recorded_at differs from the event's recorded_at")
    if event.get("version_id") is not None:
        check_version(seq, event, row[11:18])
        if row[18] is not None:
            check_content(seq, row[18:23], row[12], row[13])
        elif row[23] is False:
            raise Bad(seq, "content_store", "the content this event stored is missing and no later event erased"
                                            " the object")


def _named(event: dict[str, Any], name: str) -> Any:
    """An event's field as the ledger's columns file it: a Relationship Version's relationship_id is filed as
    its object_id (ids are one namespace per scope)."""
    if name == "object_id" and event.get("object_id") is None:
        return event.get("relationship_id")
    return event.get(name)


def check_version(seq: int, event: dict[str, Any], version: tuple[Any, ...]) -> None:
    version_id, scope_id, object_id, sequence, ledger_sequence, meta, digest = version
    if version_id is None:
        raise Bad(seq, "memory_versions", "the version this event committed is missing")
    payload = event.get("payload") or {}
    expected = {"scope_id": event.get("scope_id"), "object_id": _named(event, "object_id"),
                "sequence": event.get("sequence"), "ledger_sequence": seq,
                "content_digest": payload.get("content_digest")}
    found = {"scope_id": scope_id, "object_id": object_id, "sequence": sequence,
             "ledger_sequence": ledger_sequence, "content_digest": digest}
    for name, value in expected.items():
        if found[name] != value:
            raise Bad(seq, f"memory_versions.{name}", f"memory_versions.{name} differs from the event")
    try:
        stored_meta = _decode.decode(bytes(meta))
    except msgspec.DecodeError:
        stored_meta = None
    if stored_meta != payload.get("envelope"):
        raise Bad(seq, "memory_versions.meta", "memory_versions.meta differs from the event's envelope")


def check_content(seq: int, content: tuple[Any, ...], scope_id: str, object_id: str) -> None:
    digest, content_scope, content_object, salt, data = content
    if (content_scope, content_object) != (scope_id, object_id):
        raise Bad(seq, "content_store.object_id", "content_store row names another object")
    if "sha256:" + hashlib.sha256(bytes(salt) + bytes(data)).hexdigest() != digest:
        raise Bad(seq, "content_store.content", "content_store.content does not match its digest")


def _timestamp(text: Any) -> datetime | None:
    try:
        return datetime.fromisoformat(str(text).replace("Z", "+00:00"))
    except ValueError:
        return None


def verify_tables(database_url: str, partition: int = 0, progress: Progress | None = None) -> dict[str, Any]:
    """The chain and every stored column, streamed through a server-side cursor (flat memory, one pass),
    then the rows of other tables no ledger row accounts for."""
    with psycopg.connect(database_url) as conn:
        head_row = conn.execute(f"SELECT {HEAD}", (partition,)).fetchone()
        with conn.cursor(name="pamledger_verify") as cur:
            cur.itersize = 2000
            cur.execute(_ROWS_SQL, (partition,))
            result = verify_rows(_rows(cur, progress, int(head_row[0]) if head_row else 0))
        if not result["ok"]:
            return result
        for check, statement in _ORPHAN_CHECKS:
            found = conn.execute(statement, {"p": partition}).fetchone()
            if found is not None:
                return failure(Bad(found[0], check, f"{check.split('.')[0]} row {found[1]!r} is not accounted"
                                   " for by the ledger"), result["rows_checked"])
        for check, statement in _DELEGATION_CHECKS:
            found = conn.execute(statement, {"p": partition}).fetchone()
            if found is not None:
                return failure(Bad(found[0], check, f"delegation {found[1]!r}: its row and its ledger entries"
                                   " disagree" if check.endswith("entries") else
                                   f"delegation {found[1]!r} is granted in the ledger but has no row"),
                               result["rows_checked"])
        for check, statement, why in _SNAPSHOT_CHECKS:
            found = conn.execute(statement, {"p": partition}).fetchone()
            if found is not None:
                return failure(Bad(found[0], check, f"snapshot {found[1]!r}: {why}"), result["rows_checked"])
        for check, statement, why in _RUN_CHECKS:
            found = conn.execute(statement, {"p": partition}).fetchone()
            if found is not None:
                return failure(Bad(found[0], check, f"evaluation run {found[1]!r}: {why}"), result["rows_checked"])
        return result


def _rows(cur: psycopg.Cursor[Any], progress: Progress | None, head: int) -> Iterator[tuple[Any, ...]]:
    """The rows, saying how far the pass is at most every PROGRESS_SECONDS."""
    if progress is None:
        yield from cur
        return
    last = time.monotonic()
    count = 0
    for count, row in enumerate(cur, start=1):
        if time.monotonic() - last >= PROGRESS_SECONDS:
            last = time.monotonic()
            progress({"rows_checked": count, "head": head})
        yield row
    progress({"rows_checked": count, "head": head})


async def verify_ledger(database_url: str, nats_url: str | None = None, stream: str | None = None,
                        partition: int = 0, nats_options: dict[str, Any] | None = None,
                        progress: Progress | None = None) -> dict[str, Any]:
    """Everything `verify_tables` checks, then the head against the JetStream replica. Without NATS the
    head is not anchored (a truncated tail would go unseen), so the answer is not ok and says why."""
    result = await asyncio.to_thread(verify_tables, database_url, partition, progress)
    if not (nats_url and stream):
        return result if not result["ok"] else {
            **result, "ok": False, "check": "stream.head",
            "reason": "the head is not anchored: verify needs NATS and the stream to see a truncated tail"}
    try:
        anchor = await _stream_anchor(nats_url, stream, nats_options or {})
    except (OSError, nats.errors.Error, asyncio.TimeoutError) as exc:
        return result if not result["ok"] else {
            **result, "ok": False, "check": "stream.head",
            "reason": f"the head is not anchored: NATS did not answer ({type(exc).__name__})"}
    if not result["ok"]:
        return await asyncio.to_thread(truncation_first, database_url, partition, result, anchor)
    return await asyncio.to_thread(check_anchor, database_url, partition, result, anchor)


def truncation_first(database_url: str, partition: int, result: dict[str, Any],
                     anchor: dict[str, Any]) -> dict[str, Any]:
    """A failed pass, unless the stream shows the tail was truncated: then that is named first (it explains
    later findings, such as content erased by a delete that is gone), with the pass's finding under `also`."""
    with psycopg.connect(database_url) as conn:
        row = conn.execute(f"SELECT {HEAD}, {IDENTITY}", (partition, partition)).fetchone()
    head, ledger_id = (int(row[0]), row[1]) if row else (0, None)
    last = anchor["last_sequence"]
    if last is None or last <= head or anchor["ledger_id"] not in (None, ledger_id):
        return result
    also = {key: result[key] for key in ("first_bad_sequence", "check", "reason")}
    return {**result, "first_bad_sequence": head + 1, "check": "stream.head", "also": also,
            "reason": f"the stream holds {last} events, the ledger {head}: rows {head + 1}..{last} are missing"
                      " from the ledger (tail truncated)"}


async def _stream_anchor(nats_url: str, stream: str, options: dict[str, Any]) -> dict[str, Any]:
    """The stream's last sequence, its ledger id and its last message (event id, bytes, row hash)."""
    # max_reconnect_attempts=0 means "forever" to nats.py: with NATS down verify would never answer.
    nc = await nats.connect(server_urls(nats_url), connect_timeout=3, max_reconnect_attempts=1, allow_reconnect=False,
                            error_cb=ConnectionLog("verify").error,  # one log line, not a traceback per try
                            **options)  # the service login, where NATS has users
    try:
        js = nc.jetstream(timeout=5)
        try:
            info = await js.stream_info(stream)
        except NotFoundError:
            return {"last_sequence": None}
        last = int(info.state.last_seq)
        anchor: dict[str, Any] = {"last_sequence": last, "ledger_id": stream_ledger_id(info)}
        if last:
            msg = await js.get_msg(stream, last)
            headers = msg.headers or {}
            anchor.update(event_id=headers.get("Nats-Msg-Id"), event=msg.data or b"",
                          row_hash=headers.get("Pam-Row-Hash"))
        return anchor
    finally:
        await nc.close()


def check_anchor(database_url: str, partition: int, result: dict[str, Any], anchor: dict[str, Any]) -> dict[str, Any]:
    """Compare the verified head with the stream's last message (pure apart from two look-ups)."""
    head = int(result["head_sequence"])
    last = anchor["last_sequence"]

    def bad(sequence: int | None, reason: str) -> dict[str, Any]:
        return {**result, "ok": False, "first_bad_sequence": sequence, "check": "stream.head", "reason": reason}

    if last is None:
        return bad(None, "the head is not anchored: the stream is missing (`pamledger stream rebuild`)")
    with psycopg.connect(database_url) as conn:
        # Read after the stream: on a live ledger rows are appended while verify runs, so the stream may hold
        # more than the pass saw; only rows the ledger lacks NOW are a truncated tail.
        ident = conn.execute(f"SELECT {IDENTITY}, {HEAD}", (partition, partition)).fetchone()
        row = conn.execute("SELECT event_id, event, row_hash FROM ledger WHERE partition = %s"
                           " AND ledger_sequence = %s", (partition, last)).fetchone() if last else None
    ledger_id, now = (ident[0], int(ident[1])) if ident else (None, head)
    if anchor["ledger_id"] not in (None, ledger_id):
        return bad(None, f"the stream belongs to ledger {anchor['ledger_id']}, this is {ledger_id}")
    if last > max(head, now):
        return bad(max(head, now) + 1, f"the stream holds {last} events, the ledger {max(head, now)}: rows"
                                       f" {max(head, now) + 1}..{last} are missing from the ledger (tail truncated)")
    if last and (row is None or row[0] != anchor["event_id"] or bytes(row[1]) != anchor["event"]
                 or (anchor["row_hash"] is not None and bytes(row[2]).hex() != anchor["row_hash"])):
        return bad(last, f"ledger row {last} differs from the stream's message at that sequence")
    return {**result, "anchored_sequence": last, "stream_behind": max(0, head - last), "ledger_id": ledger_id,
            "appended_during_verify": max(0, now - head)}  # past the checked head: the next run checks them
