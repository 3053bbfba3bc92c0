"""Every README snippet runs as written against the test servers with the service running: each ```python
block as a script in a fresh venv holding only the pamledger-client wheel (and its two dependencies), and the
quick start's CLI lines through the real `pamledger` entry point.

Why: the snippets are what a new user tries first, and an agent's environment has the client alone; a snippet
that does not run there is a bug."""

from __future__ import annotations

import asyncio
import json
import os
import re
import shlex
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from infra.settings import AuthSettings
from tests.conftest import Env, Servers, fresh_database, fresh_settings

README = Path(__file__).resolve().parents[2] / "README.md"
PAMLEDGER = str(Path(sys.executable).with_name("pamledger"))
TIMEOUT = 120
ROOT = README.parent
# What `pip install ./client` may bring: the client, its two dependencies, and what a new venv starts with.
CLIENT_ONLY = {"pamledger-client", "nats-py", "msgspec", "pip", "setuptools"}


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


def pip(python: Path, *args: str | Path) -> str:
    done = subprocess.run([str(python), "-m", "pip", "--disable-pip-version-check", *map(str, args)],
                          capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


@pytest.fixture(scope="module")
def client_wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The pamledger-client wheel, built from client/ as a user would (not an editable install)."""
    dist = tmp_path_factory.mktemp("client-wheel")
    pip(Path(sys.executable), "wheel", "--no-deps", "-q", "-w", dist, ROOT / "client")
    (wheel,) = dist.glob("pamledger_client-*.whl")
    return wheel


def fresh_venv(where: Path, *requirements: str) -> Path:
    """A venv outside the checkout with `requirements` installed (pinned as make pins them); its python."""
    subprocess.run([sys.executable, "-m", "venv", str(where)], check=True, timeout=300)
    python = where / "bin" / "python"
    pip(python, "install", "-q", "-c", ROOT / "constraints.txt", *requirements)
    return python


@pytest.fixture(scope="module")
def client_only(client_wheel: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """The python of a venv holding only pamledger-client (no extras)."""
    yield fresh_venv(tmp_path_factory.mktemp("client-only") / "venv", str(client_wheel))


@pytest.fixture(scope="module")
def client_admin(client_wheel: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """The python of a venv holding pamledger-client with its `admin` extra (bcrypt)."""
    yield fresh_venv(tmp_path_factory.mktemp("client-admin") / "venv", f"{client_wheel}[admin]")


def installed(python: Path) -> set[str]:
    return {line.split("==")[0].lower() for line in pip(python, "freeze", "--all").splitlines() if "==" in line}


def test_the_client_installs_alone_with_only_its_own_name(client_only: Path, client_wheel: Path) -> None:
    """Two dependencies, one top-level name, no server module, and its CLI answers."""
    assert installed(client_only) <= CLIENT_ONLY, installed(client_only)
    import zipfile

    tops = {name.split("/")[0] for name in zipfile.ZipFile(client_wheel).namelist()}
    assert {top for top in tops if not top.endswith(".dist-info")} == {"pamledger_client"}, tops
    probe = ("import importlib.util, pamledger_client\n"
             "print(sorted(m for m in ('schemas', 'infra', 'authz', 'pamledger', 'query', 'psycopg', 'pydantic',"
             " 'onnxruntime', 'numpy') if importlib.util.find_spec(m)))\n")
    done = subprocess.run([str(client_only), "-c", probe], capture_output=True, text=True, cwd=client_only.parent,
                          timeout=60)
    assert done.returncode == 0 and done.stdout.strip() == "[]", done.stdout + done.stderr
    version = subprocess.run([str(client_only.with_name("pamledger-client")), "--version"], capture_output=True,
                             text=True, timeout=60)
    assert version.stdout.startswith("pamledger-client 0."), version.stdout + version.stderr


async def run_snippet(python: Path, service: Env, folder: Path, index: int) -> tuple[int, str, str]:
    script = folder / f"snippet_{index}.py"
    script.write_text(blocks("python")[index])
    proc = await asyncio.create_subprocess_exec(str(python), str(script), cwd=folder, env=readme_env(service, folder),
                                                stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    out, err = await asyncio.wait_for(proc.communicate(), TIMEOUT)
    assert proc.returncode is not None
    return proc.returncode, out.decode(), err.decode()


def needs_admin(index: int) -> bool:
    return "pamledger_client.admin" in blocks("python")[index]


@pytest.mark.parametrize("index", range(len(blocks("python"))))
async def test_each_python_snippet_runs_as_written_with_only_the_client(
        service: Env, client_only: Path, client_admin: Path, tmp_path: Path, index: int) -> None:
    """The agent's snippets in a venv with the client alone; the administrator's, which issue a token, with the
    client's `admin` extra (the README says so)."""
    code, out, err = await run_snippet(client_admin if needs_admin(index) else client_only, service, tmp_path, index)
    assert code == 0, f"snippet {index}:\n{blocks('python')[index]}\nstderr: {err[-3000:]}"
    assert out.strip(), f"snippet {index} printed nothing"


async def test_issuing_a_token_without_the_admin_extra_says_which_extra(service: Env, client_only: Path,
                                                                         tmp_path: Path) -> None:
    (index,) = [i for i in range(len(blocks("python"))) if needs_admin(i)]
    code, _, err = await run_snippet(client_only, service, tmp_path, index)
    assert code != 0 and "pamledger-client[admin]" in err and "invalid_request" in err, err[-2000:]
