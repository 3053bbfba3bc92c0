"""The wheel works where the checkout is not: built, installed into a fresh venv outside the repository, and run
from another folder (`--version`, `up`, the writer and query roles, one create and read, `down`).

Why: `make` installs editable, so a module left out of the wheel (a package list that forgot `infra/authz` once)
fails nowhere else. The install resolves the dependencies as a user's would (from pip's cache when warm).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def run(argv: list[str | Path], cwd: Path, env: dict[str, str], timeout: float = 300) -> str:
    done = subprocess.run([str(a) for a in argv], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    assert done.returncode == 0, f"{argv[:3]} exited {done.returncode}: {done.stderr[-3000:]}"
    return done.stdout


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, Path, dict[str, str]]]:
    """(pamledger of a fresh venv, a folder outside the checkout, the environment to run it in)."""
    tmp = tmp_path_factory.mktemp("wheel")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PAMLEDGER_", "VIRTUAL_ENV", "PYTHON"))}
    for source in (ROOT, ROOT / "client"):  # the server depends on pamledger-client, built from client/
        run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--disable-pip-version-check", "-q", "-w",
             tmp / "dist", source], tmp, env)
    wheels = sorted((tmp / "dist").glob("pamledger*.whl"))
    assert [w.name.split("-")[0] for w in wheels] == ["pamledger", "pamledger_client"], wheels
    run([sys.executable, "-m", "venv", tmp / "venv"], tmp, env)
    run([tmp / "venv" / "bin" / "python", "-m", "pip", "install", "-q", "--disable-pip-version-check", *wheels], tmp,
        env, timeout=900)
    elsewhere = tmp / "elsewhere"
    elsewhere.mkdir()
    env.update(PAMLEDGER_STATE_DIR=str(tmp / "state"), PAMLEDGER_INDEXER__DEFAULT_SPACE="hashing-16",
               PAMLEDGER_LOG_FORMAT="json")
    yield tmp / "venv" / "bin" / "pamledger", elsewhere, env


def test_the_installed_wheel_serves_a_create_and_a_read(installed: tuple[Path, Path, dict[str, str]]) -> None:
    pamledger, cwd, env = installed
    assert run([pamledger, "--version"], cwd, env).startswith("pamledger ")
    python = pamledger.parent / "python"
    where = run([python, "-c", "import pamledger, infra.sql, authz.policy, pamledger_client.protocol;"
                 " print(pamledger.__file__, pamledger_client.protocol.__file__)"], cwd, env)
    assert "site-packages" in where and str(ROOT) not in where  # the wheel's modules, not the checkout's
    run([pamledger, "up"], cwd, env)
    serving = subprocess.Popen([str(pamledger), "serve", "--roles", "writer,query"], cwd=cwd, env=env,
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 120
        while True:  # the roles answer once they lead: until then scope-create is not answered
            done = subprocess.run([str(pamledger), "scope-create", "workspace:wheel"], cwd=cwd, env=env,
                                  capture_output=True, text=True, timeout=60)
            if done.returncode == 0 or time.monotonic() > deadline:
                break
            time.sleep(0.5)
        assert done.returncode == 0, done.stderr[-2000:]
        made = json.loads(run([pamledger, "create", "workspace:wheel", "claim", '{"statement": "from the wheel"}'],
                              cwd, env))
        read = json.loads(run([pamledger, "read", "workspace:wheel", made["envelope"]["object_id"]], cwd, env))
        assert read["canonical_content"] == {"statement": "from the wheel"}  # read prints the envelope
    finally:
        serving.terminate()
        serving.wait(timeout=60)
        run([pamledger, "down"], cwd, env)
