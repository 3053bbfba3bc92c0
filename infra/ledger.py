"""The ledger vocabulary every service shares: its row types, the head read, the idempotent-replay read.

Why in the kernel: the writer appends these rows, the relay replicates them, the query service, the
projector's audits and the gateway read the head; each used to import them from another service. Every
read names its partition (the ledger is partitioned from day one; one machine runs partition 0).
"""

from __future__ import annotations

from typing import Any

import msgspec
import psycopg

from schemas.canonical import canonical_bytes, decode_json
from schemas.common import SYSTEM_SCOPE
from schemas.replies import entry_result_bytes, envelope_bytes, id_field

# The ledger head through the (partition, ledger_sequence) key: one index probe, whatever the ledger size.
# HEAD is the expression (one parameter: the partition), for statements that read it beside other positions.
HEAD = "coalesce((SELECT max(ledger_sequence) FROM ledger WHERE partition = %s), 0)"
HEAD_SQL = f"SELECT {HEAD}"


class LedgerRow(msgspec.Struct, frozen=True, kw_only=True):
    """One ledger row as written and as replicated to JetStream."""

    ledger_sequence: int
    event_id: str
    operation_id: str
    scope_id: str
    object_id: str | None
    version_id: str | None
    event_type: str
    recorded_at: Any
    event: bytes
    prev_hash: bytes
    row_hash: bytes


class IdempotencyRow(msgspec.Struct, frozen=True, kw_only=True):
    """What a command with an idempotency key committed: its version, or (object_id and version_id None)
    the event-only ledger entry at ledger_sequence."""

    scope_id: str
    idempotency_key: str
    request_digest: str
    object_id: str | None
    version_id: str | None
    ledger_sequence: int


async def ledger_head(conn: psycopg.AsyncConnection[Any], partition: int) -> int:
    """The last ledger sequence of the partition (0 for an empty ledger)."""
    row = await (await conn.execute(HEAD_SQL, (partition,))).fetchone()
    return int(row[0]) if row else 0


# Content a later redaction hides: while an object's latest version is redacted or partially redacted, no
# earlier version's content is shown, by any read (read, history, as-of queries, idempotent replays), even
# where content storage still keeps it (a suppression, until a restoration).
HIDING_STATES = ("redacted", "partially_redacted")


async def ledger_tail(conn: psycopg.AsyncConnection[Any], partition: int) -> tuple[int, bytes | None]:
    """The partition's last (ledger_sequence, row_hash); (0, None) for an empty ledger."""
    cur = await conn.execute("SELECT ledger_sequence, row_hash FROM ledger WHERE partition = %s"
                             " ORDER BY ledger_sequence DESC LIMIT 1", (partition,))
    row = await cur.fetchone()
    return (int(row[0]), bytes(row[1])) if row else (0, None)


async def known_event_ids(conn: psycopg.AsyncConnection[Any], partition: int, event_ids: list[str]) -> set[str]:
    """Which of these event ids the partition's ledger holds."""
    if not event_ids:
        return set()
    cur = await conn.execute("SELECT event_id FROM ledger WHERE partition = %s AND event_id = ANY(%s)",
                             (partition, event_ids))
    return {str(row[0]) for row in await cur.fetchall()}


def hidden_by_latest(alias: str) -> str:
    """SQL: whether the memory_versions row `alias` is an earlier version whose content `latest` hides. The
    latest version's metadata is parsed only for an earlier version (a CASE fixes the order): most rows are
    their object's latest, and the parse was most of what this test cost per row."""
    return (f"CASE WHEN latest.version_id <> {alias}.version_id THEN convert_from(latest.meta, 'UTF8')::jsonb"
            " ->> 'availability_state' IN ('" + "', '".join(HIDING_STATES) + "') ELSE false END")


def latest_version(alias: str, outer: bool = False) -> str:
    """SQL: a LATERAL `latest(version_id, meta)`, the newest version of the object of the memory_versions row
    `alias` (`outer`: a LEFT JOIN, for rows without one); hidden_by_latest tests it."""
    join, on = ("LEFT JOIN LATERAL", " ON true") if outer else ("CROSS JOIN LATERAL", "")
    return (join + " (SELECT w.version_id, w.meta FROM memory_versions w"
            f" WHERE w.scope_id = {alias}.scope_id AND w.object_id = {alias}.object_id"
            " ORDER BY w.sequence DESC LIMIT 1) latest" + on)


async def fetch_replay(conn: psycopg.AsyncConnection[Any], record: IdempotencyRow, partition: int) -> bytes:
    """The original result of an idempotent command, rebuilt from the version it committed (or, for an
    event-only entry, from its ledger row)."""
    if record.version_id is None:
        cur = await conn.execute("SELECT event_id FROM ledger WHERE partition = %s AND ledger_sequence = %s"
                                 " AND scope_id = %s", (partition, record.ledger_sequence, record.scope_id))
        entry = await cur.fetchone()
        assert entry is not None, "idempotency record without its ledger entry"
        return entry_result_bytes(record.ledger_sequence, entry[0], replayed=True)
    cur = await conn.execute(
        "SELECT v.sequence, v.meta, CASE WHEN " + hidden_by_latest("v") + " THEN NULL ELSE c.content END, l.event_id,"
        " p.event FROM memory_versions v LEFT JOIN content_store c ON c.content_digest = v.content_digest"
        " JOIN ledger l ON l.partition = %s AND l.ledger_sequence = v.ledger_sequence " + latest_version("v") +
        " " + _PROMOTION + " WHERE v.version_id = %s",
        (partition, record.version_id),
    )
    row = await cur.fetchone()
    assert row is not None, "idempotency record without its version"
    meta = decode_json(bytes(row[1]))
    promoted = decode_json(bytes(row[4]))["payload"] if row[4] is not None else {}
    return canonical_bytes({"result": {
        id_field(meta): record.object_id,
        "version_id": record.version_id,
        "sequence": row[0],
        "ledger_sequence": record.ledger_sequence,
        "event_id": row[3],
        "envelope": msgspec.Raw(envelope_bytes(meta, bytes(row[2]) if row[2] else None)),
        "idempotency_result": "replayed_original_result",
        **({"promotion": promoted} if promoted.get("promoted_object_id") == record.object_id else {}),
    }})


# A promote's reply carries `promotion` (its links), so its replay does too: the working_memory_promoted entry
# of the same operation, among the entries that follow its object_created (the fourth, one more when a tool
# type's entry comes between). Read in the replay's one statement.
_PROMOTION = (
    "LEFT JOIN LATERAL (SELECT f.event FROM ledger f WHERE l.event_type = 'object_created'"
    " AND f.partition = l.partition AND f.ledger_sequence BETWEEN l.ledger_sequence + 1 AND l.ledger_sequence + 4"
    " AND f.event_type = 'working_memory_promoted' AND f.operation_id = l.operation_id LIMIT 1) p ON true"
)


# The last `default_space_set` entry of the system scope at or before a ledger sequence (the indexer records
# each switch of the default Embedding Space there: indexer.role.set_default).
_DEFAULT_SPACE_AT = (
    "SELECT convert_from(event, 'UTF8')::jsonb -> 'payload' ->> 'embedding_space_id' FROM ledger"
    " WHERE scope_id = %s AND event_type = 'index_rebuilt' AND ledger_sequence <= %s"
    " AND convert_from(event, 'UTF8')::jsonb -> 'payload' ->> 'action' = 'default_space_set'"
    " ORDER BY ledger_sequence DESC LIMIT 1")


async def default_space_at(conn: psycopg.AsyncConnection[Any], sequence: int) -> str | None:
    """The id of the space that was the default at `sequence` (None: no default yet), from the ledger: a
    switch made later changes nothing of what a snapshot sealed at `sequence` searches."""
    cur = await conn.execute(_DEFAULT_SPACE_AT, (SYSTEM_SCOPE, sequence))
    row = await cur.fetchone()
    return str(row[0]) if row is not None and row[0] is not None else None
