"""`pamledger index rebuild`, `pamledger spaces`, `pamledger index set-default` and `status` through the CLI,
against a running service with the indexer.

Why: a new space must fill from the objects that existed before it, beside the old default which keeps its
vectors and stays the default until the explicit, recorded switch.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

import msgspec
import psycopg
import pytest
from psycopg import sql

from embedding.embedders import hashing_space
from embedding.store import find_space
from pamledger.supervisor import ROLES as ALL_ROLES
from schemas.common import SYSTEM_SCOPE
from tests.conftest import ACTOR, PROVENANCE, TEST_SPACE, Env, run_cli, serving, wait_for
from tests.integration.test_indexer import indexed_through

SCOPE = "workspace:rebuilt"
OLD = hashing_space(int(TEST_SPACE.split("-")[1]))
NEW = hashing_space(24)


async def table(env: Env, space_id: str) -> dict[str, tuple[str, str]]:
    async with await psycopg.AsyncConnection.connect(env.database_url, autocommit=True) as conn:
        space = await find_space(conn, space_id)
        assert space is not None
        cur = await conn.execute(sql.SQL("SELECT object_id, version_id, embedding::text FROM {}").format(space.table))
        return {r[0]: (r[1], r[2]) for r in await cur.fetchall()}


@pytest.fixture(scope="module")
async def made(env: Env) -> AsyncIterator[list[dict[str, Any]]]:
    async with serving(env, ALL_ROLES, roles=ALL_ROLES) as client:
        await client.create_scope(SCOPE)
        objects = [await client.create(SCOPE, "claim", {"statement": f"fact number {i}"}, ACTOR, PROVENANCE)
                   for i in range(12)]
        await wait_for(lambda: indexed_through(env, objects[-1]["ledger_sequence"]), timeout=30)
        await wait_for(lambda: _ready(env, OLD.embedding_space_id), timeout=30)  # filled, if it came after them
        yield objects


def cli_json(env: Env, *args: str) -> tuple[int, Any, str]:
    done = run_cli(env, *args)
    out = json.loads(done.stdout) if done.returncode == 0 else json.loads(done.stderr.strip().splitlines()[-1])
    return done.returncode, out, done.stderr


async def test_a_new_space_fills_from_existing_objects_while_the_old_default_keeps_its_vectors(
        env: Env, made: list[dict[str, Any]]) -> None:
    before = await table(env, OLD.embedding_space_id)
    code, out, err = await asyncio.to_thread(cli_json, env, "index", "rebuild", "--model", "hashing-24")
    assert code == 0, err
    assert out["embedding_space_id"] == NEW.embedding_space_id and out["state"] == "ready"
    progress = [json.loads(line)["progress"] for line in err.splitlines() if line.startswith('{"progress"')]
    assert progress and progress[-1]["done"] == progress[-1]["total"] == len(made)  # JSON lines off a terminal
    filled = await table(env, NEW.embedding_space_id)
    assert {oid: v for oid, (v, _) in filled.items()} == {m["object_id"]: m["version_id"] for m in made}
    assert await table(env, OLD.embedding_space_id) == before
    async with await psycopg.AsyncConnection.connect(env.database_url, autocommit=True) as conn:
        default = await find_space(conn, None)
    assert default is not None and default.embedding_space_id == OLD.embedding_space_id


async def test_spaces_reports_each_space_with_counts_and_the_indexer_position(
        env: Env, made: list[dict[str, Any]]) -> None:
    code, out, err = await asyncio.to_thread(cli_json, env, "spaces")
    assert code == 0, err
    spaces = {s["embedding_space_id"]: s for s in out["spaces"]}
    for space_id in (OLD.embedding_space_id, NEW.embedding_space_id):
        assert spaces[space_id]["state"] == "ready"
        assert (spaces[space_id]["vectors"], spaces[space_id]["stale"], spaces[space_id]["missing"]) == (12, 0, 0)
        assert spaces[space_id]["descriptor"]["embedding_space_id"] == space_id
    assert spaces[OLD.embedding_space_id]["default"] and not spaces[NEW.embedding_space_id]["default"]
    assert out["indexer_checkpoint"] + out["backlog"] == out["ledger_sequence"]


async def test_set_default_switches_by_a_ledger_entry_and_refuses_unknown_or_unfilled_spaces(
        env: Env, made: list[dict[str, Any]]) -> None:
    code, out, err = await asyncio.to_thread(cli_json, env, "index", "set-default", "space:nobody:v1")
    assert code != 0 and out["error"]["code"] == "invalid_request"
    other = msgspec.structs.replace(hashing_space(8), embedding_space_id="space:elsewhere:v1", provider="elsewhere")
    async with serving(env, ALL_ROLES, roles=ALL_ROLES) as client:
        from infra.requester import CommandRequester

        requester = CommandRequester(client.nc, env.settings.subject_prefix)
        await requester.command("register_embedding_space", {"scope_id": SYSTEM_SCOPE,
                                "space": msgspec.to_builtins(other), "actor": ACTOR})
        await wait_for(lambda: _exists(env, other.embedding_space_id), timeout=30)
        code, out, err = await asyncio.to_thread(cli_json, env, "index", "set-default", other.embedding_space_id)
        assert code != 0 and out["error"]["details"]["state"] == "filling"
        code, out, err = await asyncio.to_thread(cli_json, env, "spaces")
        reported = {s["embedding_space_id"]: s for s in out["spaces"]}[other.embedding_space_id]
        assert (reported["embedder"], reported["state"], reported["missing"]) == ("unavailable", "filling", 12)
        code, out, err = await asyncio.to_thread(cli_json, env, "index", "rebuild", "--space",
                                                 other.embedding_space_id)
        assert code != 0 and out["error"]["code"] == "invalid_request"
        code, out, err = await asyncio.to_thread(cli_json, env, "index", "set-default", NEW.embedding_space_id)
        assert code == 0, err
        assert out["default"] is True
        code, out, err = await asyncio.to_thread(cli_json, env, "status")
    assert code == 0, err
    position = out["postgres"]
    assert position["indexer_checkpoint"] + position["indexer_behind"] == position["ledger_sequence"]
    assert {s["embedding_space_id"]: s["default"] for s in position["spaces"]}[NEW.embedding_space_id] is True
    rows = await _system_actions(env)
    assert rows.count("default_space_set") == 2  # the initial one and the explicit switch


async def _ready(env: Env, space_id: str) -> bool:
    async with await psycopg.AsyncConnection.connect(env.database_url, autocommit=True) as conn:
        space = await find_space(conn, space_id)
        return space is not None and space.state == "ready"


async def _exists(env: Env, space_id: str) -> bool:
    async with await psycopg.AsyncConnection.connect(env.database_url, autocommit=True) as conn:
        return await find_space(conn, space_id) is not None


async def _system_actions(env: Env) -> list[str]:
    async with await psycopg.AsyncConnection.connect(env.database_url, autocommit=True) as conn:
        cur = await conn.execute("SELECT event FROM ledger WHERE scope_id = %s ORDER BY ledger_sequence",
                                 (SYSTEM_SCOPE,))
        return [msgspec.json.decode(bytes(r[0]))["payload"].get("action") for r in await cur.fetchall()]
