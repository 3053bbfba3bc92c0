"""Every line of a JSON log is JSON, and exceptions in it carry their traceback: our own records
(`log.exception`, as the role loops write `writer.crashed` / `projector.crashed`) and the standard
library's (psycopg's "error ignored terminating" warning, nats-py's errors) alike, and the exception that
ends a process."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
# The psycopg record is logged as psycopg logs it (psycopg/_pipeline_async.py); provoking the real one
# depends on when the server's reply arrives, so a test of it would be flaky.
SCRIPT = """
import logging, sys
import structlog
from infra.logging import configure_logging

configure_logging(sys.argv[1])
log = structlog.get_logger("pamledger.runtime")
try:
    {}["missing"]
except KeyError:
    log.exception("projector.crashed")
logging.getLogger("psycopg").warning("error ignored terminating %r: %s", "<psycopg.AsyncPipeline>",
                                     "pipeline aborted")
logging.getLogger("nats.aio.client").error("nats: encountered error", exc_info=ValueError("boom"))
logging.getLogger("nats.aio.client").debug("not at the configured level")
raise RuntimeError("the process ends here")
"""


def run(fmt: str) -> str:
    done = subprocess.run([sys.executable, "-c", SCRIPT, fmt], cwd=ROOT, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 1, done.stderr
    return done.stderr


def test_every_line_of_a_json_log_is_json_and_crashes_carry_their_traceback() -> None:
    records: list[dict[str, Any]] = [json.loads(line) for line in run("json").splitlines()]
    crashed = next(r for r in records if r["event"] == "projector.crashed")
    assert "exc_info" not in crashed
    assert "Traceback (most recent call last)" in crashed["exception"] and "KeyError: 'missing'" in crashed["exception"]
    ignored = next(r for r in records if r["event"].startswith("error ignored terminating"))
    assert ignored["logger"] == "psycopg" and ignored["level"] == "warning" and "timestamp" in ignored
    nats = next(r for r in records if r.get("logger") == "nats.aio.client")
    assert "ValueError: boom" in nats["exception"]
    crash = records[-1]
    assert crash["event"] == "process.crashed" and "RuntimeError: the process ends here" in crash["exception"]
    assert len(records) == 4, "records below the configured level are left out"


def test_a_console_log_shows_the_traceback() -> None:
    text = run("console")
    assert "projector.crashed" in text and "KeyError" in text and "missing" in text
    assert "error ignored terminating" in text and "ValueError: boom" in text
    assert "process.crashed" in text and "RuntimeError: the process ends here" in text
