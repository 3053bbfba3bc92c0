"""(f) The single writer's storage floor: its own append, with batches planned before the clock starts.

How many creates/s could the ledger take if everything but the append cost nothing: no NATS, no
decoding, no decide, no relay, no projector. The rows are exactly what pamledger writes for the bench's
create command (the real intake and planner make them, hash chain included, before timing starts); they
go through `PostgresLedgerStore.append` in batches as large as the requests in flight (the most one group
commit can gather; one statement each), one after another on one autocommit connection, because one
writer appends on one connection. Latencies are per batch.

a/f says how much of the storage floor the whole service delivers; f/c how far the a/c target is from
what storage alone allows on this machine: if f/c < 0.4, no writer with this data model can meet a/c >= 0.4
here.
"""

from __future__ import annotations

import asyncio
import time

import psycopg

from bench.load import INSERT_SCOPE_SQL, SCOPE_ID, Result, create_payload
from command_handler.core.chain import GENESIS_HASH
from command_handler.core.intake import Parsed, parse
from command_handler.core.planner import PlanInputs, plan_batch
from command_handler.core.batch import Batch
from command_handler.store import SINGLE_STATEMENT_ROWS, PostgresLedgerStore
from command_handler.stamps import new_stamp
from schemas.errors import PamledgerError
from schemas.registry import default_registry

CREATES_PER_SECOND_GUESS = 12_000  # sizes the prebuilt work so the run lasts about `duration`


def planned_batches(creates: int, size: int = SINGLE_STATEMENT_ROWS) -> list[Batch]:
    """`creates` bench creates, each with its own idempotency key, planned in batches as the writer would."""
    payload = create_payload()
    tail, batches, registry = (0, GENESIS_HASH), [], default_registry()
    for start in range(0, creates, size):
        items: list[Parsed | PamledgerError] = [parse("create", payload, {"Pam-Idempotency-Key": f"floor:{i}"}, 1 << 20)
                 for i in range(start, min(creates, start + size))]
        plan = plan_batch(items, PlanInputs(heads={}, idempotency={}, scope_known=lambda _: True,
                                                  stamp=new_stamp, tail=tail, registry=registry))
        if any(o.error is not None for o in plan.outcomes):
            raise RuntimeError(f"the planner refused a bench create: {plan.outcomes}")
        tail = plan.tail
        batches.append(plan.batch)
    return batches


async def append_floor(url: str, warmup: float, duration: float, batch_size: int) -> Result:
    """Append prebuilt batches back to back; the measured window starts after `warmup` seconds of them."""
    batches = planned_batches(int(CREATES_PER_SECOND_GUESS * (warmup + duration)), batch_size)
    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
        await conn.execute(INSERT_SCOPE_SQL, (SCOPE_ID,))
        store = PostgresLedgerStore(conn)
        latencies, creates = [], 0
        start = time.perf_counter() + warmup
        for batch in batches:
            t0 = time.perf_counter()
            await store.append(batch)
            t1 = time.perf_counter()
            if t1 >= start:
                latencies.append(t1 - t0)
                creates += len(batch.ledger)
        seconds = sum(latencies)
    if not latencies:
        raise RuntimeError("the storage floor finished its batches inside the warm-up; raise CREATES_PER_SECOND_GUESS")
    result = Result("(f) storage floor", creates, seconds, latencies, 1)
    result.extra.update(batch_size=batch_size, batches=len(latencies),
                        measured_seconds=round(time.perf_counter() - start, 3))
    return result


def run_append_floor(url: str, warmup: float, duration: float, in_flight: int) -> Result:
    """The floor for `in_flight` requests in flight: batches of that size (capped where the writer's append
    switches from one statement to COPYs)."""
    return asyncio.run(append_floor(url, warmup, duration, min(in_flight, SINGLE_STATEMENT_ROWS)))
