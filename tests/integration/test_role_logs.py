"""Role loops under lasting faults: they back off, log one line per change, and never print the data.

Why: a gateway that failed right after taking its lock logged a traceback every 0.5 s with no backoff
(the loop counted the lock as "serving again" and reset itself), and a crash traceback printed Postgres'
DETAIL lines, which can quote the data. A real `pamledger serve` process with JSON logs and a real
Postgres fault (a trigger a superuser adds).
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import psycopg

from tests.conftest import Env, Servers, fresh_database, fresh_settings, wait_for
from tests.integration.test_outage_logs import Serve, serving  # noqa: F401 - a fixture

CANARY = "canary-7f3a9c-secret-content"
WINDOW_SECONDS = 8.0

# Every attempt of a role to start counts itself in a sequence (nextval survives the rollback), then fails
# with a DETAIL that quotes "data", as a constraint's "Failing row contains (...)" does.
FAULT = f"""
CREATE SEQUENCE role_attempts;
CREATE FUNCTION refuse_identity() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  PERFORM nextval('role_attempts');
  RAISE EXCEPTION 'refused by the test' USING DETAIL = 'Failing row contains ({CANARY}).';
END $$;
CREATE TRIGGER refuse_identity BEFORE INSERT ON ledger_identity
  FOR EACH STATEMENT EXECUTE FUNCTION refuse_identity();
"""


async def attempts(database_url: str) -> int:
    async with await psycopg.AsyncConnection.connect(database_url) as conn:
        row = await (await conn.execute("SELECT last_value, is_called FROM role_attempts")).fetchone()
        assert row is not None
        return int(row[0]) if row[1] else 0


async def test_a_role_failing_right_after_its_lock_backs_off_and_logs_one_traceback_without_the_data(
        servers: Servers, tmp_path: Path, serving: list[Serve]) -> None:
    env = Env(servers, fresh_database(servers, "rolelogs"), fresh_settings("rolelogs"))
    with psycopg.connect(env.database_url, autocommit=True) as conn:
        conn.execute(FAULT)
    proc = Serve(env, "projector,gateway", tmp_path / "serve.log")
    serving.append(proc)
    await wait_for(lambda: attempts(env.database_url), timeout=120)
    # The fault lasts: these are the fault's duration, not waits for a condition.
    await asyncio.sleep(WINDOW_SECONDS / 2)
    earlier = await attempts(env.database_url)
    await asyncio.sleep(WINDOW_SECONDS / 2)
    tried = await attempts(env.database_url)
    assert proc.proc.poll() is None, "the process serves on"

    # Two roles, each doubling its wait from 0.2 s up to 2 s: about 5 attempts each in the first 4 s and 2
    # in the next. Without a real backoff each retries every 0.2 s (about 20 each in both halves).
    assert 4 <= tried <= 24, f"{tried} attempts in {WINDOW_SECONDS}s"
    assert tried - earlier < earlier, f"no backoff: {earlier} attempts, then {tried - earlier} more"
    records = proc.records()
    crashed = [r for r in records if r["event"].endswith(".crashed")]
    assert sorted(r["event"] for r in crashed) == ["gateway.crashed", "projector.crashed"], crashed
    for record in crashed:
        assert "RaiseException: refused by the test" in record["exception"]
        assert "Traceback (most recent call last)" in record["exception"]
    assert not [r for r in records if r["event"].endswith(".recovered")]
    assert CANARY not in proc.text()
