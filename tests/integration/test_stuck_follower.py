"""A projector that cannot apply an event: it applies everything before it, reports itself stuck, retries
with backoff, never skips the event, and catches up by itself once the cause is gone; the rest serves on.

The projector runs as its own process with JSON logs, as `pamledger run` runs it. The fault is injected
without mocks: as the superuser, a trigger on the projection table refuses the rows
of one schema_id, so the writer commits the event and only the projector fails on it.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import psycopg

from pamledger.runtime import run_service
from pamledger_client.client import MemoryClient, PamspecError
from projector.replay import ReplayOptions, replay
from infra.projections import checkpoint
from tests.conftest import ACTOR, PROVENANCE, Env, wait_for

SCOPE = "workspace:stuck"
POISON_SCHEMA = "https://example.com/poison.json"
ROOT = Path(__file__).resolve().parents[2]
REFUSE_POISON = f"""
CREATE FUNCTION refuse_poison() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  IF NEW.schema_id = '{POISON_SCHEMA}' THEN
    RAISE EXCEPTION 'injected fault: this row is refused';
  END IF;
  RETURN NEW;
END $$;
CREATE TRIGGER refuse_poison BEFORE INSERT OR UPDATE ON current_objects
  FOR EACH ROW EXECUTE FUNCTION refuse_poison();
"""


@contextlib.asynccontextmanager
async def serving(env: Env, roles: tuple[str, ...]) -> AsyncIterator[asyncio.Task[None]]:
    stop = asyncio.Event()
    task = asyncio.create_task(run_service(env.settings, env.nats_url, env.database_url, stop, roles=roles))
    try:
        yield task
    finally:
        stop.set()
        await task


@contextlib.contextmanager
def projector_process(env: Env, log_path: Path) -> Iterator[None]:
    """The projector role as a real process (`pamledger serve --roles projector`) logging JSON to a file."""
    environment = {**os.environ, **_environment(env), "PAMLEDGER_LOG_FORMAT": "json",
                   "PAMLEDGER_FOLLOWER__RETRY_FIRST_SECONDS": "0.2", "PAMLEDGER_FOLLOWER__RETRY_MAX_SECONDS": "1"}
    with open(log_path, "ab") as log:
        proc = subprocess.Popen([sys.executable, "-m", "pamledger", "serve", "--roles", "projector"], cwd=ROOT,
                                env=environment, stdout=log, stderr=log)
        try:
            yield
        finally:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def _environment(env: Env) -> dict[str, str]:
    return {"PAMLEDGER_NATS_URL": env.nats_url, "PAMLEDGER_DATABASE_URL": env.database_url,
            "PAMLEDGER_SUBJECT_PREFIX": env.settings.subject_prefix,
            "PAMLEDGER_STREAM_NAME": env.settings.stream_name,
            # the module's auth mode (off): enforced, the process would make tokens in the repository's .pamledger
            "PAMLEDGER_AUTH__MODE": env.settings.auth.mode}


async def status(client: MemoryClient, role: str) -> dict[str, Any] | None:
    try:
        return await client.status(role)
    except PamspecError:
        return None


async def note(client: MemoryClient, text: str, schema_id: str = "https://example.com/note.json") -> dict[str, Any]:
    return await client.create(SCOPE, "com.example.note", {"body": text}, ACTOR, PROVENANCE, schema_id=schema_id,
                               validation_state="corroborated")


async def projected(env: Env) -> int:
    async with await psycopg.AsyncConnection.connect(env.database_url, autocommit=True) as conn:
        return await checkpoint(conn)


async def test_projector_stuck_on_one_event_applies_its_prefix_reports_retries_and_recovers(
        env: Env, tmp_path: Path) -> None:
    client = await MemoryClient.connect(env.nats_url, env.settings.subject_prefix)
    client.retries = 0
    with psycopg.connect(env.database_url, autocommit=True) as admin:
        admin.execute(REFUSE_POISON)
    # Written while no projector runs, so the projector then receives them together in one batch.
    async with serving(env, ("query", "writer", "gateway")):
        await wait_for(lambda: status(client, "writer"), timeout=60)
        await client.create_scope(SCOPE)
        good = [await note(client, f"good {i}") for i in range(3)]
        poison = await note(client, "refused by the projection", schema_id=POISON_SCHEMA)
        after = await note(client, "after the bad one")
        assert poison["ledger_sequence"] == good[-1]["ledger_sequence"] + 1
        log_path = tmp_path / "projector.log"
        with projector_process(env, log_path):
            report = await wait_for(lambda: _stuck_retried(client), timeout=60)
            assert report["sequence"] == poison["ledger_sequence"]
            assert "injected fault: this row is refused" in report["reason"]
            assert report["since"].endswith("Z")
            # Everything before the bad event is applied, nothing at or after it.
            assert await projected(env) == poison["ledger_sequence"] - 1
            # The other roles serve on: writes commit, reads answer, queries answer with their freshness.
            later = await note(client, "written while the projector is stuck")
            assert (await client.read(SCOPE, later["object_id"]))["version_id"] == later["version_id"]
            result = await client.query(SCOPE, min_sequence=later["ledger_sequence"], wait_ms=100)
            assert result["as_of_sequence"] == poison["ledger_sequence"] - 1
            assert result["min_sequence_reached"] is False
            assert {item["envelope"]["object_id"] for item in result["items"]} == {g["object_id"] for g in good}
            assert (await asyncio.to_thread(_status_cli, env))["problems"][0].startswith(
                f"projector stuck at ledger sequence {poison['ledger_sequence']} since ")

            with psycopg.connect(env.database_url, autocommit=True) as admin:
                admin.execute("DROP TRIGGER refuse_poison ON current_objects")
            await wait_for(lambda: _caught_up(env, client, later["ledger_sequence"]), timeout=60)
    # The projector's JSON log: every line JSON, the failure logged once with its traceback, not per retry.
    logs = [json.loads(line) for line in log_path.read_text().splitlines()]
    failures = [entry for entry in logs if entry["event"] == "projector.event_failed"]
    assert len(failures) == 1, "logged once per state change, not per retry"
    assert failures[0]["ledger_sequence"] == poison["ledger_sequence"]
    assert "Traceback (most recent call last)" in failures[0]["exception"]
    assert "injected fault: this row is refused" in failures[0]["exception"]
    assert "CONTEXT" not in failures[0]["exception"], "Postgres' detail lines (they may quote data) stay out"
    announced = [e["event"] for e in logs if e["event"] in ("leadership.acquired", "projector.following")]
    assert announced == ["leadership.acquired", "projector.following"], "retries are not announced at info"
    assert [entry["ledger_sequence"] for entry in logs if entry["event"] == "projector.recovered"] == [
        poison["ledger_sequence"]]
    verified = await replay(env.database_url, ReplayOptions(verify=True))
    assert verified["verify"]["equal"] is True
    assert verified["rows"] == 6 and after["object_id"] in await _projected_ids(env)
    await client.close()


async def _stuck_retried(client: MemoryClient) -> dict[str, Any] | None:
    """The projector's stuck report once it has retried at least twice (so retries are not logged)."""
    reply = await status(client, "projector")
    stuck = (reply or {}).get("stuck")
    return stuck if stuck and stuck["attempts"] >= 3 else None


async def _caught_up(env: Env, client: MemoryClient, sequence: int) -> bool:
    reply = await status(client, "projector")
    return bool(reply) and reply.get("stuck") is None and await projected(env) >= sequence


async def _projected_ids(env: Env) -> set[str]:
    async with await psycopg.AsyncConnection.connect(env.database_url) as conn:
        cur = await conn.execute("SELECT object_id FROM current_objects")
        return {row[0] for row in await cur.fetchall()}


def _status_cli(env: Env) -> dict[str, Any]:
    """`pamledger status` as a user runs it (in a thread: the service answers from this test's event loop):
    JSON on stdout, a sentence per problem on stderr, exit 1."""
    environment = {**_environment(env), "PATH": "/usr/bin:/bin"}
    done = subprocess.run([sys.executable, "-m", "pamledger", "status"], cwd=ROOT, env=environment,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 1, done.stderr
    report: dict[str, Any] = json.loads(done.stdout)
    assert report["projector"]["stuck"]["sequence"] > 0
    assert "projector stuck at ledger sequence" in done.stderr
    return report
