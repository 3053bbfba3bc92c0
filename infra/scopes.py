"""The kernel's reads of the scope registry (the writer owns `scopes`; `infra.tables` declares this reader).

Why in the kernel: the query service, the Subscribe gateway, retention, audits and the CLI all ask whether a
scope exists, and retention asks which scopes set a policy; each used to write its own SQL for it.
"""

from __future__ import annotations

from typing import Any

import psycopg
from psycopg import sql

# An SQL expression (one parameter: the scope id): true when the scope exists. For statements that read it
# in the same round trip as other positions.
SCOPE_EXISTS = "EXISTS (SELECT 1 FROM scopes WHERE scope_id = %s)"
SCOPE_EXISTS_SQL = f"SELECT {SCOPE_EXISTS}"
# Scopes whose policy sets `key` (other than the system scope), one or all: (scope_id, policy) in id order.
_POLICIES_SQL = (
    "SELECT scope_id, policy FROM scopes WHERE policy ? %(key)s AND scope_id <> %(system)s"
    " AND (%(scope)s::text IS NULL OR scope_id = %(scope)s) ORDER BY scope_id")


async def scope_exists(conn: psycopg.AsyncConnection[Any], scope_id: str) -> bool:
    row = await (await conn.execute(SCOPE_EXISTS_SQL, (scope_id,))).fetchone()
    return bool(row and row[0])


async def scope_record(conn: psycopg.AsyncConnection[Any], scope_id: str) -> dict[str, Any] | None:
    """The scope as registered (scope_id, scope_kind, parent_scope_id and policy where set), or None."""
    row = await (await conn.execute("SELECT scope_id, scope_kind, parent_scope_id, policy FROM scopes"
                                    " WHERE scope_id = %s", (scope_id,))).fetchone()
    if row is None:
        return None
    names = ("scope_id", "scope_kind", "parent_scope_id", "policy")
    return {name: value for name, value in zip(names, row) if value is not None}


async def scopes_with_policy(conn: psycopg.AsyncConnection[Any], key: str, system_scope: str,
                             scope_id: str | None = None) -> list[tuple[str, Any]]:
    """(scope_id, policy) of every scope whose policy names `key`, the system scope aside; `scope_id` narrows
    the answer to that scope."""
    cur = await conn.execute(_POLICIES_SQL, {"key": key, "system": system_scope, "scope": scope_id})
    return [(str(r[0]), r[1]) for r in await cur.fetchall()]


async def scope_partitions(conn: psycopg.AsyncConnection[Any], scope_ids: list[str]) -> dict[str, int]:
    """The partition each of these scopes was created in (infra.partitions); scopes not created are absent."""
    if not scope_ids:
        return {}
    cur = await conn.execute("SELECT scope_id, partition FROM scopes WHERE scope_id = ANY(%s)", (scope_ids,))
    return {str(r[0]): int(r[1]) for r in await cur.fetchall()}


def scopes_in_partitions(partitions: list[int]) -> sql.Composed:
    """A subquery: the ids of the scopes created in these partitions (for `scope_id IN (...)`)."""
    return sql.SQL("SELECT scope_id FROM scopes WHERE partition = ANY({})").format(sql.Literal(partitions))
