"""`replay` on a ledger event the projection cannot hold fails with an error naming its ledger sequence,
not a raw `UntranslatableCharacter` traceback.

The writer refuses such values now, so the poison is planted as a superuser would find it in an older
ledger: content whose JSON holds `\\u0000`, which Postgres' jsonb (the full-text vector) cannot take.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import psycopg
import pytest

from pamledger_client.client import MemoryClient
from projector.replay import ReplayOptions, replay
from projector.replay_diagnosis import ReplayFailed
from tests.conftest import ACTOR, PROVENANCE, Env, wait_for
from tests.integration.test_replay import run_cli

SCOPE = "workspace:replay-poison"


@pytest.fixture(scope="module")
async def poisoned(client: MemoryClient, service: Env) -> dict[str, Any]:
    """Three objects, the middle one's content forged to hold a NUL escape, once all are projected."""
    await client.create_scope(SCOPE)
    made = [await client.create(SCOPE, "claim", {"statement": f"note {i}"}, ACTOR, PROVENANCE) for i in range(3)]
    async with await psycopg.AsyncConnection.connect(service.database_url, autocommit=True) as conn:
        async def projected() -> bool:
            cur = await conn.execute("SELECT ledger_sequence FROM projection_checkpoints")
            row = await cur.fetchone()
            return bool(row) and row[0] >= made[-1]["ledger_sequence"]

        await wait_for(projected, timeout=60)
        await conn.execute("UPDATE content_store SET content = %s WHERE object_id = %s",
                           (b'{"statement": "a\\u0000b"}', made[1]["object_id"]))
    return made[1]


async def test_replay_names_the_ledger_sequence_it_cannot_project(poisoned: dict[str, Any], service: Env) -> None:
    with pytest.raises(ReplayFailed) as failed:
        await replay(service.database_url, ReplayOptions())
    assert failed.value.code == "internal_error"
    assert failed.value.details["ledger_sequence"] == poisoned["ledger_sequence"]
    assert "UntranslatableCharacter" in failed.value.details["reason"]
    assert f"ledger sequence {poisoned['ledger_sequence']}" in failed.value.message


async def test_the_cli_replay_prints_the_error_envelope_not_a_traceback(poisoned: dict[str, Any],
                                                                         service: Env) -> None:
    done = await asyncio.to_thread(run_cli, service, "replay")
    assert done.returncode == 1
    envelopes = [json.loads(line) for line in done.stderr.splitlines() if line.startswith('{"error"')]
    assert len(envelopes) == 1, done.stderr  # the envelope goes to stderr (one error format for the CLI)
    assert envelopes[0]["error"]["details"]["ledger_sequence"] == poisoned["ledger_sequence"]
    assert "Traceback" not in done.stderr
