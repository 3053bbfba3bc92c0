"""The writer's two ways to append a batch, one statement (up to SINGLE_STATEMENT_ROWS) and COPYs in a
transaction (larger), write exactly the same rows: the same planned batches go through each into a
database of its own."""

from __future__ import annotations

from typing import Any

import msgspec
import psycopg

from command_handler.core.chain import GENESIS_HASH
from command_handler.core.intake import parse
from command_handler.core.planner import Plan, PlanInputs, plan_batch
from command_handler.core.batch import Batch
from command_handler.store import PostgresLedgerStore
from command_handler.stamps import new_stamp
from schemas.registry import default_registry
from tests.conftest import ACTOR, PROVENANCE, Servers, fresh_database

SCOPE = "workspace:append-paths"
TABLES = {  # every column but defaults the database fills in itself (scopes.created_at)
    "ledger": "*", "memory_versions": "*", "content_store": "*", "idempotency_records": "*",
    "scopes": "scope_id, scope_kind, parent_scope_id, policy",
}
_encode = msgspec.json.encode


def _plan(commands: list[tuple[str, dict[str, Any], dict[str, str]]], inputs: PlanInputs) -> Plan:
    items = [parse(name, _encode(body), headers, 1 << 20) for name, body, headers in commands]
    plan = plan_batch(items, inputs)
    assert all(outcome.error is None for outcome in plan.outcomes), plan.outcomes
    return plan


def planned_batches() -> list[Batch]:
    """A scope, 60 creates (every other one with an idempotency key), an event-only entry with a key;
    then updates, a transition and deletes of some of those objects."""
    first = [("create_scope", {"scope_id": SCOPE, "scope_kind": "workspace"}, {})]
    first += [("create", {"scope_id": SCOPE, "object_type": "claim", "canonical_content": {"n": i, "text": f"fact {i}"},
                          "actor": ACTOR, "provenance": PROVENANCE}, {"Pam-Idempotency-Key": f"k:{i}"} if i % 2 else {})
              for i in range(60)]
    first.append(("open_subscription", {"scope_id": SCOPE, "subscription_id": "sub:paths", "actor": ACTOR,
                                        "subscription": {"filter": {}}}, {"Pam-Idempotency-Key": "open:paths"}))
    one = _plan(first, PlanInputs(heads={}, idempotency={}, scope_known=lambda _: False, stamp=new_stamp,
                                  tail=(0, GENESIS_HASH), registry=default_registry()))
    heads = sorted(one.heads.values(), key=lambda head: head.object_id)
    second = [("update", {"scope_id": SCOPE, "object_id": h.object_id, "expected_version_id": h.version_id,
                          "canonical_content": {"updated": True}, "actor": ACTOR, "provenance": PROVENANCE}, {})
              for h in heads[:5]]
    second += [("delete", {"scope_id": SCOPE, "object_id": h.object_id, "expected_version_id": h.version_id,
                           "actor": ACTOR, "provenance": PROVENANCE}, {"Pam-Idempotency-Key": f"del:{h.object_id}"})
               for h in heads[5:8]]
    second.append(("transition", {"scope_id": SCOPE, "object_id": heads[8].object_id,
                                  "expected_version_id": heads[8].version_id, "dimension": "validation",
                                  "target_state": "corroborated", "actor": ACTOR, "provenance": PROVENANCE}, {}))
    two = _plan(second, PlanInputs(heads=one.heads, idempotency={}, scope_known=lambda _: True, stamp=new_stamp,
                                   tail=one.tail, registry=default_registry()))
    return [one.batch, two.batch]


async def _append_all(url: str, batches: list[Batch], single_statement_rows: int) -> dict[str, list[tuple[Any, ...]]]:
    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
        store = PostgresLedgerStore(conn, single_statement_rows=single_statement_rows)
        for batch in batches:
            await store.append(batch)
        out = {}
        for table, columns in TABLES.items():
            cur = await conn.execute(f"SELECT {columns} FROM {table} ORDER BY 1, 2, 3")
            out[table] = await cur.fetchall()
        return out


async def test_one_statement_and_copy_write_the_same_rows(servers: Servers) -> None:
    batches = planned_batches()
    assert len(batches[0].ledger) == 61 and batches[1].erase, "the batches cover creates, an entry and erasure"
    by_statement = await _append_all(fresh_database(servers, "paths_stmt"), batches, single_statement_rows=10**6)
    by_copy = await _append_all(fresh_database(servers, "paths_copy"), batches, single_statement_rows=0)
    assert by_statement == by_copy
    assert len(by_statement["ledger"]) == 61 + 9
    assert len(by_statement["idempotency_records"]) == 30 + 1 + 3
    erased = {h[1] for h in batches[1].erase}
    assert erased and not erased & {row[2] for row in by_statement["content_store"]}, "deleted content is gone"
