"""The writer's Postgres port: leadership lock, the batch append, and (store_reads) the look-ups a batch needs.

Every write of one batch happens in ONE transaction on the connection that holds the advisory lock, so
a writer that lost the lock (its session died) cannot commit.
"""

from __future__ import annotations

import functools
from typing import Any

import msgspec
import psycopg

from command_handler.core.batch import ERASED_REQUEST, Batch, ContentRow, forgotten, kept_content, last_erasures, tail_problem
from command_handler.core.chain import GENESIS_HASH
from command_handler.store_reads import LedgerReads
from embedding.handoff import hand_over

# Up to this many creates one statement (JSON parameters) beats COPYs in a transaction (4-6 round trips):
# measured here 1.6x at 32 rows, 1.4x at 64, 1.1x at 128; about even near 200, COPY ahead from 256.
SINGLE_STATEMENT_ROWS = 128
_batch_json = msgspec.json.Encoder()
# The single-statement append: one data-modifying CTE per kind of row the batch holds, each fed by ONE
# JSON parameter (an array of rows; bytea values base64, as msgspec writes bytes). psycopg dumps one string
# in microseconds, where forty array parameters cost it a quarter of a millisecond per batch; one parameter
# per part (not one document) lets Postgres parse each JSON text once, and parts with no rows are left out
# of the statement (a create batch has no scopes and erases nothing).
_APPEND_PARTS = {
    "scopes": """new_scopes AS (
  INSERT INTO scopes (scope_id, scope_kind, parent_scope_id, policy, partition)
  SELECT s.scope_id, s.scope_kind, s.parent_scope_id, s.policy::jsonb, %(partition)s
  FROM json_to_recordset(%(scopes)s::json) AS s(scope_id text, scope_kind text, parent_scope_id text, policy text)
  ON CONFLICT (scope_id) DO NOTHING)""",
    "ledger": """new_ledger AS (
  INSERT INTO ledger (partition, ledger_sequence, event_id, operation_id, scope_id, object_id, version_id,
                      event_type, recorded_at, event, prev_hash, row_hash)
  SELECT %(partition)s, l.ledger_sequence, l.event_id, l.operation_id, l.scope_id, l.object_id, l.version_id,
         l.event_type, l.recorded_at, decode(l.event, 'base64'), decode(l.prev_hash, 'base64'),
         decode(l.row_hash, 'base64')
  FROM json_to_recordset(%(ledger)s::json)
       AS l(ledger_sequence bigint, event_id text, operation_id text, scope_id text, object_id text,
            version_id text, event_type text, recorded_at timestamptz, event text, prev_hash text, row_hash text))""",
    "versions": """new_versions AS (
  INSERT INTO memory_versions (scope_id, object_id, sequence, version_id, ledger_sequence, meta, content_digest)
  SELECT v.scope_id, v.object_id, v.sequence, v.version_id, v.ledger_sequence, decode(v.meta, 'base64'),
         v.content_digest
  FROM json_to_recordset(%(versions)s::json)
       AS v(scope_id text, object_id text, sequence int, version_id text, ledger_sequence bigint, meta text,
            content_digest text))""",
    "content": """new_content AS (
  INSERT INTO content_store (content_digest, scope_id, object_id, salt, content)
  SELECT c.content_digest, c.scope_id, c.object_id, decode(c.salt, 'base64'), decode(c.content, 'base64')
  FROM json_to_recordset(%(content)s::json) AS c(content_digest text, scope_id text, object_id text, salt text,
                                                 content text))""",
    "idempotency": """new_records AS (
  INSERT INTO idempotency_records (scope_id, idempotency_key, request_digest, object_id, version_id,
                                   ledger_sequence)
  SELECT i.scope_id, i.idempotency_key, i.request_digest, i.object_id, i.version_id, i.ledger_sequence
  FROM json_to_recordset(%(idempotency)s::json)
       AS i(scope_id text, idempotency_key text, request_digest text, object_id text, version_id text,
            ledger_sequence bigint))""",
    "delegations": """delegation_states AS (
  INSERT INTO delegations (delegation_id, scope_id, grant_object, uses, revoked)
  SELECT d.delegation_id, d.scope_id, convert_to(d."grant"::text, 'UTF8'), d.uses, d.revoked
  FROM json_to_recordset(%(delegations)s::json)
       AS d(delegation_id text, scope_id text, "grant" json, uses int, revoked boolean)
  ON CONFLICT (delegation_id) DO UPDATE SET uses = excluded.uses, revoked = excluded.revoked)""",
    "snapshots": """sealed_snapshots AS (
  INSERT INTO evaluation_snapshots (snapshot_id, scope_id, ledger_sequence, descriptor)
  SELECT s.snapshot_id, s.scope_id, s.ledger_sequence, decode(s.descriptor, 'base64')
  FROM json_to_recordset(%(snapshots)s::json)
       AS s(snapshot_id text, scope_id text, ledger_sequence bigint, descriptor text))""",
    "runs": """started_runs AS (
  INSERT INTO evaluation_runs (scope_id, evaluation_run_id, started_sequence, record, ended_sequence)
  SELECT r.scope_id, r.evaluation_run_id, r.started_sequence, decode(r.record, 'base64'), r.ended_sequence
  FROM json_to_recordset(%(runs)s::json)
       AS r(scope_id text, evaluation_run_id text, started_sequence bigint, record text, ended_sequence bigint))""",
    "ended_runs": """ended_runs AS (
  UPDATE evaluation_runs r SET ended_sequence = e.seq
  FROM json_to_recordset(%(ended_runs)s::json) AS e(scope_id text, seq bigint) WHERE r.scope_id = e.scope_id)""",
    "erase": """erased AS (
  DELETE FROM content_store c USING json_to_recordset(%(erase)s::json)
                                    AS k(scope_id text, object_id text, keep text, seq bigint)
  WHERE c.scope_id = k.scope_id AND c.object_id = k.object_id AND c.content_digest IS DISTINCT FROM k.keep),
forgotten AS (
  UPDATE idempotency_records r SET request_digest = '""" + ERASED_REQUEST + """.' || split_part(r.request_digest, '.', 2)
  FROM json_to_recordset(%(erase)s::json) AS k(scope_id text, object_id text, keep text, seq bigint)
  WHERE r.scope_id = k.scope_id AND r.object_id = k.object_id AND r.ledger_sequence < k.seq)""",
}


@functools.lru_cache(maxsize=64)
def append_statement(parts: tuple[str, ...]) -> bytes:
    """The single-statement append for a batch holding rows of these kinds (keys of _APPEND_PARTS)."""
    return ("WITH " + ",\n".join(_APPEND_PARTS[part] for part in parts) + "\nSELECT 1").encode()


class PostgresLedgerStore(LedgerReads):
    """LedgerStore on one psycopg AsyncConnection that holds the partition's writer lock."""

    def __init__(self, conn: psycopg.AsyncConnection[Any], partition: int = 0,
                 single_statement_rows: int = SINGLE_STATEMENT_ROWS):
        self.conn = conn
        self.partition = partition
        self.single_statement_rows = single_statement_rows

    async def tail(self) -> tuple[int, bytes]:
        cur = await self.conn.execute(
            "SELECT ledger_sequence, row_hash FROM ledger WHERE partition = %s ORDER BY ledger_sequence DESC LIMIT 1",
            (self.partition,),
        )
        row = await cur.fetchone()
        return (int(row[0]), bytes(row[1])) if row else (0, GENESIS_HASH)

    async def broken_tail(self, rows: int) -> str | None:
        """Why the chain's last `rows` rows do not link and recompute (None: they do). The writer appends
        to this tail, so it refuses to while it is broken rather than chain new rows onto a forgery."""
        cur = await self.conn.execute(
            "SELECT ledger_sequence, event, prev_hash, row_hash FROM ledger WHERE partition = %s"
            " ORDER BY ledger_sequence DESC LIMIT %s", (self.partition, rows))
        found = await cur.fetchall()
        return tail_problem([(int(r[0]), bytes(r[1]), bytes(r[2]), bytes(r[3])) for r in reversed(found)])

    async def append(self, batch: Batch) -> None:
        """Write the batch atomically; raises (and writes nothing) on any failure.

        Small batches go as ONE statement in autocommit (an implicit transaction: one round trip, commit
        included); larger ones as COPYs inside an explicit transaction, which wins once rows add up.
        Content of an object that the same batch erases is never written at all: data-modifying CTEs
        share one snapshot, so the erasing DELETE could not see rows inserted beside it.
        """
        batch = last_erasures(batch)
        content = kept_content(batch)
        idempotency = [msgspec.structs.replace(r, request_digest=forgotten(r.request_digest)) if any(
            (r.scope_id, r.object_id) == (e[0], e[1]) and r.ledger_sequence < e[3] for e in batch.erase) else r
            for r in batch.idempotency] if batch.erase else batch.idempotency
        batch = msgspec.structs.replace(batch, idempotency=idempotency)
        if len(batch.ledger) <= self.single_statement_rows and not batch.handoff:
            await self._append_parts(batch, content, tuple(_APPEND_PARTS))
            return
        async with self.conn.transaction():
            await self._append_with_copy(batch, content)
            await hand_over(self.conn, batch.handoff)  # with the entries the indexer will read

    async def _append_parts(self, batch: Batch, content: list[ContentRow], parts: tuple[str, ...]) -> None:
        """The rows of these kinds (keys of _APPEND_PARTS) in one append_statement, each kind one JSON
        array parameter; kinds the batch has no rows of are left out (nothing at all: no statement)."""
        rows: dict[str, list[Any]] = {
            "scopes": [{"scope_id": s[0], "scope_kind": s[1], "parent_scope_id": s[2], "policy": s[3]}
                       for s in batch.scopes],
            "ledger": batch.ledger, "versions": batch.versions, "content": content,
            "idempotency": batch.idempotency,
            "erase": [{"scope_id": e[0], "object_id": e[1], "keep": e[2], "seq": e[3]} for e in batch.erase],
            "delegations": batch.delegations, "snapshots": batch.snapshots, "runs": batch.runs,
            "ended_runs": [{"scope_id": e[0], "seq": e[1]} for e in batch.ended_runs],
        }
        params: dict[str, Any] = {part: _batch_json.encode(rows[part]).decode() for part in parts if rows[part]}
        if not params:
            return
        if "ledger" in params or "scopes" in params:  # a scope is created in the partition of its writer
            params["partition"] = self.partition
        await self.conn.execute(append_statement(tuple(part for part in _APPEND_PARTS if part in params)), params)

    async def _append_with_copy(self, batch: Batch, content: list[ContentRow]) -> None:
        """COPY per table; scopes and erasure (few rows, conflict handling, a join) by the statement's parts."""
        cur = self.conn.cursor()
        await self._append_parts(batch, content, ("scopes",))
        await self._copy(cur, "ledger (partition, ledger_sequence, event_id, operation_id, scope_id, object_id,"
                          " version_id, event_type, recorded_at, event, prev_hash, row_hash)",
                          [(self.partition, r.ledger_sequence, r.event_id, r.operation_id, r.scope_id,
                            r.object_id, r.version_id, r.event_type, r.recorded_at, r.event, r.prev_hash,
                            r.row_hash) for r in batch.ledger])
        await self._copy(cur, "memory_versions (scope_id, object_id, sequence, version_id, ledger_sequence,"
                          " meta, content_digest)",
                          [(v.scope_id, v.object_id, v.sequence, v.version_id, v.ledger_sequence, v.meta,
                            v.content_digest) for v in batch.versions])
        await self._copy(cur, "content_store (content_digest, scope_id, object_id, salt, content)",
                          [(c.content_digest, c.scope_id, c.object_id, c.salt, c.content) for c in content])
        await self._copy(cur, "idempotency_records (scope_id, idempotency_key, request_digest, object_id,"
                          " version_id, ledger_sequence)",
                          [(i.scope_id, i.idempotency_key, i.request_digest, i.object_id, i.version_id,
                            i.ledger_sequence) for i in batch.idempotency])
        await self._append_parts(batch, content, ("erase", "delegations", "snapshots", "runs", "ended_runs"))

    @staticmethod
    async def _copy(cur: psycopg.AsyncCursor[Any], target: str, rows: list[tuple[Any, ...]]) -> None:
        if not rows:
            return
        async with cur.copy(f"COPY {target} FROM STDIN") as copy:
            for row in rows:
                await copy.write_row(row)
