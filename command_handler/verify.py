"""`pamledger verify`: recompute the ledger's hash chain and name the first broken row."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import psycopg

from command_handler.chain import GENESIS_HASH, row_hash


def verify_rows(rows: Iterable[tuple[int, bytes, bytes, bytes]]) -> dict[str, Any]:
    """rows: (ledger_sequence, event, prev_hash, row_hash) in ledger order. Pure, so tests can feed it."""
    expected_prev, expected_seq, count = GENESIS_HASH, 1, 0
    for seq, event, prev, stored in rows:
        problem = None
        if seq != expected_seq:
            problem = f"sequence gap: expected {expected_seq}, found {seq}"
        elif prev != expected_prev:
            problem = "prev_hash does not match the previous row's hash"
        elif row_hash(prev, seq, event) != stored:
            problem = "row_hash does not match the row's bytes"
        if problem:
            return {"ok": False, "rows_checked": count, "first_bad_sequence": seq, "reason": problem}
        expected_prev, expected_seq, count = stored, seq + 1, count + 1
    return {"ok": True, "rows_checked": count, "head_sequence": expected_seq - 1, "head_hash": expected_prev.hex()}


def verify_ledger(database_url: str, partition: int = 0) -> dict[str, Any]:
    """Stream the ledger through a server-side cursor so memory stays flat on any size."""
    with psycopg.connect(database_url) as conn, conn.cursor(name="pamledger_verify") as cur:
        cur.itersize = 5000
        cur.execute(
            "SELECT ledger_sequence, event, prev_hash, row_hash FROM ledger WHERE partition = %s"
            " ORDER BY ledger_sequence", (partition,),
        )
        return verify_rows((r[0], bytes(r[1]), bytes(r[2]), bytes(r[3])) for r in cur)
