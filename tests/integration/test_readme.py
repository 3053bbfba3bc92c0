"""Every README snippet runs as written against the test servers with the service running: each ```python
block as a script, and the quick start's CLI lines through the real `pamledger` entry point.

Why: the snippets are what a new user tries first; a snippet that does not run is a bug."""

from __future__ import annotations

import asyncio
import json
import os
import re
import shlex
import signal
import sys
from pathlib import Path

import pytest

from infra.settings import AuthSettings
from tests.conftest import Env, Servers, fresh_database, fresh_settings

README = Path(__file__).resolve().parents[2] / "README.md"
PAMLEDGER = str(Path(sys.executable).with_name("pamledger"))
TIMEOUT = 120


def blocks(language: str) -> list[str]:
    return re.findall(rf"^```{language}\n(.*?)^```", README.read_text(), flags=re.M | re.S)


def quick_start_lines() -> list[str]:
    """The `.venv/bin/pamledger ...` lines of the quick start (`make run` is what the fixtures do)."""
    return [line for line in blocks("sh")[0].splitlines() if line.startswith(".venv/bin/pamledger ")]


@pytest.fixture(scope="module")
def env(servers: Servers, tmp_path_factory: pytest.TempPathFactory) -> Env:
    """Auth enforced, as `make run` serves: its administrative token is in the state dir the commands use."""
    state = tmp_path_factory.mktemp("readme") / ".pamledger"
    settings = fresh_settings("readme", auth=AuthSettings(mode="enforce", admin_token_file=state / "admin.token",
                                                          service_token_file=state / "service.token"))
    return Env(servers, fresh_database(servers, "readme"), settings)


def readme_env(env: Env, folder: Path) -> dict[str, str]:
    """Only what `make run` would have given: where NATS/Postgres are, this module's names, and the state dir
    holding the administrative token."""
    base = {k: v for k, v in os.environ.items() if not k.startswith("PAMLEDGER_")}
    state_dir = Path(str(env.settings.auth.admin_token_file)).parent
    base.update(PAMLEDGER_NATS_URL=env.nats_url, PAMLEDGER_DATABASE_URL=env.database_url,
                PAMLEDGER_SUBJECT_PREFIX=env.settings.subject_prefix, PAMLEDGER_STREAM_NAME=env.settings.stream_name,
                PAMLEDGER_STATE_DIR=str(state_dir), PAMLEDGER_LOG_FORMAT="json")
    return base


def test_the_readme_has_the_snippets_this_test_runs() -> None:
    assert len(blocks("python")) >= 3
    commands = [shlex.split(line, comments=True)[1] for line in quick_start_lines()]
    assert commands[:3] == ["status", "scope-create", "create"] and "subscribe" in commands


async def run_line(env: Env, folder: Path, argv: list[str]) -> tuple[int, bytes, bytes]:
    proc = await asyncio.create_subprocess_exec(*argv, cwd=folder, env=readme_env(env, folder),
                                                stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    assert proc.stdout is not None
    if argv[1] == "subscribe":  # a tail -f: the first event, then Ctrl-C
        assert "ledger_sequence" in json.loads(await asyncio.wait_for(proc.stdout.readline(), TIMEOUT))
        proc.send_signal(signal.SIGINT)
    out, err = await asyncio.wait_for(proc.communicate(), TIMEOUT)
    assert proc.returncode is not None
    return proc.returncode, out, err


def queried(out: bytes) -> list[str]:
    return [item["envelope"]["object_id"] for item in json.loads(out)["items"]] if out.strip() else []


async def test_the_quick_start_cli_lines_run_as_written(service: Env, tmp_path: Path) -> None:
    object_id = ""
    for line in quick_start_lines():
        line = line.replace("<object_id printed above>", object_id).replace("<object_id>", object_id)
        argv = [PAMLEDGER, *shlex.split(line, comments=True)[1:]]
        code, out, err = await run_line(service, tmp_path, argv)
        # query and replay --verify read the projection, which follows the ledger: on a loaded box, ask again
        for _ in range(60):
            if argv[1] not in ("query", "replay") or (code == 0 and (argv[1] != "query" or queried(out))):
                break
            await asyncio.sleep(1)
            code, out, err = await run_line(service, tmp_path, argv)
        assert code == 0, f"{line}\nstdout: {out.decode()[-2000:]}\nstderr: {err.decode()[-2000:]}"
        if argv[1] == "create":
            object_id = json.loads(out)["object_id"]
        if argv[1] == "query":
            assert queried(out) == [object_id]


@pytest.mark.parametrize("index", range(len(blocks("python"))))
async def test_each_python_snippet_runs_as_written(service: Env, tmp_path: Path, index: int) -> None:
    script = tmp_path / f"snippet_{index}.py"
    script.write_text(blocks("python")[index])
    env = readme_env(service, tmp_path)
    env["PYTHONPATH"] = str(README.parent)  # what the editable install gives a user's own venv
    proc = await asyncio.create_subprocess_exec(sys.executable, str(script), cwd=tmp_path, env=env,
                                                stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    out, err = await asyncio.wait_for(proc.communicate(), TIMEOUT)
    assert proc.returncode == 0, f"snippet {index}:\n{script.read_text()}\nstderr: {err.decode()[-3000:]}"
    assert out.strip(), f"snippet {index} printed nothing"
