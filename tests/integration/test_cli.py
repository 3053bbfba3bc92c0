"""The real `pamledger` entry point against the test servers, run from a folder of its own: one error
format (the envelope on stderr, non-zero exit, whatever failed: a setting, NATS, Postgres, the local servers,
deep content, a bug), content from a file or stdin, argument checks on replay and
audit, help that lists the choices, and subscriptions closed on Ctrl-C unless kept."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
from pathlib import Path
from typing import Any

import pytest

from local_servers.launch import free_port
from pamledger_client.client import MemoryClient
from tests.conftest import Env, wait_for

PAMLEDGER = str(Path(sys.executable).with_name("pamledger"))
SCOPE = "workspace:cli"


def cli_env(env: Env, state_dir: Path, urls: bool = True) -> dict[str, str]:
    base = {k: v for k, v in os.environ.items() if not k.startswith("PAMLEDGER_")}
    base.update(PAMLEDGER_STATE_DIR=str(state_dir), PAMLEDGER_SUBJECT_PREFIX=env.settings.subject_prefix,
                PAMLEDGER_STREAM_NAME=env.settings.stream_name, PAMLEDGER_LOG_FORMAT="json",
                PAMLEDGER_AUTH__MODE=env.settings.auth.mode)  # the service's, as an operator would set it
    if urls:
        base.update(PAMLEDGER_NATS_URL=env.nats_url, PAMLEDGER_DATABASE_URL=env.database_url)
    return base


async def run(env: Env, folder: Path, *args: str, stdin: bytes | None = None, urls: bool = True,
              extra: dict[str, str] | None = None, timeout: float = 120) -> tuple[int, Any, str]:
    """Run `pamledger ARGS` in `folder`; (exit code, stdout parsed as JSON or None, stderr)."""
    proc = await asyncio.create_subprocess_exec(
        PAMLEDGER, *args, cwd=folder, env={**cli_env(env, folder / "state", urls), **(extra or {})},
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    out, err = await asyncio.wait_for(proc.communicate(stdin), timeout)
    assert proc.returncode is not None
    return proc.returncode, json.loads(out) if out.strip() else None, err.decode()


def error_of(stderr: str) -> dict[str, Any]:
    """The one JSON error envelope line on stderr."""
    lines = [json.loads(line) for line in stderr.splitlines() if line.startswith('{"error"')]
    assert len(lines) == 1, stderr
    error: dict[str, Any] = lines[0]["error"]
    assert set(error) == {"code", "message", "retryable", "operation_id", "details"}
    assert error["operation_id"].startswith("op:"), error  # minted client-side when no request got through
    return error


@pytest.fixture(scope="module")
async def scope(client: MemoryClient) -> str:
    await client.create_scope(SCOPE)
    return SCOPE


async def test_every_failure_is_the_envelope_on_stderr(service: Env, scope: str, tmp_path: Path) -> None:
    code, out, err = await run(service, tmp_path, "read", scope, "mem:absent")
    assert (code, out, error_of(err)["code"]) == (1, None, "object_not_found")
    code, out, err = await run(service, tmp_path, "create", scope, "claim", "{not json")
    assert (code, out, error_of(err)["code"]) == (1, None, "invalid_request")
    code, out, err = await run(service, tmp_path, "create", "bad scope", "claim", "{}")
    assert (code, out, error_of(err)["code"]) == (2, None, "invalid_request")
    assert "not a PAMSPEC id" in error_of(err)["message"] and "regex" not in err
    dead = {"PAMLEDGER_DATABASE_URL": "postgresql://nobody@127.0.0.1:1/none"}
    code, out, err = await run(service, tmp_path, "audit", "--scope", scope, "--at", "0", extra=dead)
    assert (code, out, error_of(err)["code"]) == (1, None, "service_unavailable")
    code, out, err = await run(service, tmp_path, "transition", scope, "mem:x", "ver:x", "colour", "red")
    assert (code, out, error_of(err)["code"]) == (2, None, "invalid_request")
    assert "colour" in error_of(err)["message"]
    code, out, err = await run(service, tmp_path, "read", scope, "mem:x", urls=False)  # nothing to find
    assert (code, out, error_of(err)["code"]) == (1, None, "service_unavailable")
    assert "PAMLEDGER_NATS_URL" in error_of(err)["message"]
    code, out, err = await run(service, tmp_path, "audit", "--scope", scope, "--at", "0", urls=False)
    assert (code, out, error_of(err)["code"]) == (1, None, "service_unavailable")


async def test_content_comes_from_a_file_or_stdin_past_the_argument_size_limit(service: Env, scope: str,
                                                                               tmp_path: Path) -> None:
    big = {"statement": "x" * 300_000}
    (tmp_path / "content.json").write_text(json.dumps(big))
    code, created, err = await run(service, tmp_path, "create", scope, "claim", "@content.json")
    assert code == 0, err
    code, read, _ = await run(service, tmp_path, "read", scope, created["object_id"])
    assert read["canonical_content"] == big
    code, updated, err = await run(service, tmp_path, "update", scope, created["object_id"], created["version_id"],
                                   "-", stdin=json.dumps({"statement": "from stdin"}).encode())
    assert code == 0, err
    code, read, _ = await run(service, tmp_path, "read", scope, created["object_id"])
    assert read["canonical_content"] == {"statement": "from stdin"}
    code, out, err = await run(service, tmp_path, "create", scope, "claim", "@missing.json")
    assert (code, out, error_of(err)["code"]) == (1, None, "invalid_request")


async def test_an_extension_type_is_created_with_its_schema_id(service: Env, scope: str, tmp_path: Path) -> None:
    note = ("com.example.note", '{"text": "an extension object"}')
    code, out, err = await run(service, tmp_path, "create", scope, *note)
    assert (code, out) == (1, None) and "schema_id" in error_of(err)["message"]
    code, created, err = await run(service, tmp_path, "create", scope, *note,
                                   "--schema-id", "https://example.com/schemas/note.json")
    assert code == 0, err
    assert created["envelope"]["schema_id"] == "https://example.com/schemas/note.json"


async def test_replay_and_audit_refuse_out_of_range_and_unknown_arguments(service: Env, scope: str,
                                                                          tmp_path: Path) -> None:
    cases = [
        (("replay", "--to-sequence", "-5"), 2, "invalid_request"),
        (("replay", "--to-sequence", "999999999"), 1, "invalid_request"),
        (("replay", "--scope", "workspace:nowhere"), 1, "scope_not_found"),
        (("audit", "--scope", scope, "--at", "-3"), 2, "invalid_request"),
        (("audit", "--scope", "workspace:nowhere", "--at", "0"), 1, "scope_not_found"),
        (("audit", "--scope", scope, "--at", "999999999"), 1, "invalid_request"),
        (("query", scope, "--order", "sideways"), 2, "invalid_request"),
    ]
    for args, expected_code, expected_error in cases:
        code, out, err = await run(service, tmp_path, *args)
        assert (code, out, error_of(err)["code"]) == (expected_code, None, expected_error), args
    code, out, err = await run(service, tmp_path, "audit", "--scope", scope, "--at", "0")
    assert code == 0 and out["scope_id"] == scope, err


async def test_help_lists_the_choices_and_the_query_defaults(service: Env, tmp_path: Path) -> None:
    proc = await asyncio.create_subprocess_exec(PAMLEDGER, "query", "--help", stdout=asyncio.subprocess.PIPE)
    text = " ".join((await proc.communicate())[0].decode().split())
    for expected in ("unverified", "default: corroborated", "observed_at_desc", "score", "shows nothing"):
        assert expected in text
    proc = await asyncio.create_subprocess_exec(PAMLEDGER, "transition", "--help", stdout=asyncio.subprocess.PIPE)
    text = " ".join((await proc.communicate())[0].decode().split())
    for expected in ("lifecycle", "availability", "retention", "validation", "legal_hold", "partially_redacted"):
        assert expected in text


async def tail(env: Env, folder: Path, *extra: str) -> tuple[asyncio.subprocess.Process, str]:
    """Start `pamledger subscribe`, wait for its first event; the process and its subscription id."""
    proc = await asyncio.create_subprocess_exec(
        PAMLEDGER, "subscribe", SCOPE, "--after", "0", *extra, cwd=folder, env=cli_env(env, folder / "state"),
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    assert proc.stdout and proc.stderr
    while True:
        line = json.loads(await asyncio.wait_for(proc.stderr.readline(), 60))
        if "subscription_id" in line:
            break
    assert "ledger_sequence" in json.loads(await asyncio.wait_for(proc.stdout.readline(), 60))
    return proc, line["subscription_id"]


async def listed(env: Env, folder: Path, *args: str) -> dict[str, str]:
    code, out, err = await run(env, folder, "subscriptions", *args)
    assert code == 0, err
    return {s["subscription_id"]: s["status"] for s in out["subscriptions"]}


async def test_ctrl_c_closes_the_subscription_unless_kept(service: Env, scope: str, tmp_path: Path) -> None:
    proc, closed_id = await tail(service, tmp_path)
    proc.send_signal(signal.SIGINT)
    assert await asyncio.wait_for(proc.wait(), 60) == 0
    await wait_for(lambda: listed(service, tmp_path, "--all"), timeout=60)
    assert (await listed(service, tmp_path, "--all"))[closed_id] != "open"
    assert closed_id not in await listed(service, tmp_path)

    proc, kept_id = await tail(service, tmp_path, "--keep")
    proc.send_signal(signal.SIGINT)
    assert await asyncio.wait_for(proc.wait(), 60) == 0
    assert (await listed(service, tmp_path))[kept_id] == "open"

    code, out, err = await run(service, tmp_path, "subscriptions", "--close", kept_id)
    assert code == 0 and out["closed"][0]["subscription_id"] == kept_id, err
    assert kept_id not in await listed(service, tmp_path)
    code, out, err = await run(service, tmp_path, "subscriptions", "--close", "sub:absent")
    assert code == 1 and out is None and error_of(err)["code"] != "internal_error"


async def test_the_cli_works_from_any_folder_given_only_the_state_dir(service: Env, scope: str,
                                                                       tmp_path: Path) -> None:
    state = tmp_path / "elsewhere" / "state"
    state.mkdir(parents=True)
    (state / "servers.json").write_text(json.dumps({"nats_url": service.nats_url,
                                                    "database_url": service.database_url}))
    folder = tmp_path / "some" / "folder"
    folder.mkdir(parents=True)
    env = {**cli_env(service, state, urls=False)}
    for args in (("scope-create", scope), ("audit", "--scope", scope, "--at", "0"), ("subscriptions",)):
        proc = await asyncio.create_subprocess_exec(PAMLEDGER, *args, cwd=folder, env=env,
                                                    stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
        out, err = await asyncio.wait_for(proc.communicate(), 120)
        assert proc.returncode == 0, (args, err.decode())
        assert json.loads(out)


async def test_commands_that_talk_to_the_service_need_only_the_nats_url(service: Env, scope: str,
                                                                         tmp_path: Path) -> None:
    only_nats = {k: v for k, v in cli_env(service, tmp_path / "empty-state").items() if k != "PAMLEDGER_DATABASE_URL"}
    proc = await asyncio.create_subprocess_exec(PAMLEDGER, "query", scope, cwd=tmp_path, env=only_nats,
                                                stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    out, err = await asyncio.wait_for(proc.communicate(), 120)
    assert proc.returncode == 0, err.decode()
    assert "items" in json.loads(out)


def no_traceback(stderr: str) -> None:
    """Nothing on stderr but the envelope and log records without tracebacks (nats.py's or a crash's)."""
    assert "Traceback" not in stderr and "process.crashed" not in stderr, stderr


async def test_settings_nats_deep_content_status_and_bugs_all_end_as_the_envelope(service: Env,
                                                                                  tmp_path: Path) -> None:
    code, out, err = await run(service, tmp_path, "status", extra={"PAMLEDGER_WRITER__TYPO": "1"})
    error = error_of(err)
    assert (code, out, error["code"]) == (1, None, "invalid_request")
    assert error["details"]["settings"][0]["setting"] == "PAMLEDGER_WRITER__TYPO"
    no_traceback(err)

    dead_nats = {"PAMLEDGER_NATS_URL": f"nats://127.0.0.1:{free_port()}"}
    code, out, err = await run(service, tmp_path, "stream", "rebuild", extra=dead_nats)
    assert (code, out, error_of(err)["code"]) == (1, None, "service_unavailable")
    no_traceback(err)
    code, out, err = await run(service, tmp_path, "verify", extra=dead_nats, timeout=60)  # before: never answered
    assert (code, out["ok"], out["check"]) == (2, False, "stream.head") and "NATS did not answer" in out["reason"]
    no_traceback(err)

    deep = tmp_path / "deep.json"
    deep.write_text("[" * 100_000 + "]" * 100_000)
    code, out, err = await run(service, tmp_path, "create", SCOPE, "claim", f"@{deep}")
    assert (code, out, error_of(err)["code"]) == (1, None, "invalid_request")
    no_traceback(err)

    code, out, err = await run(service, tmp_path, "status", urls=False)  # nothing recorded in the state dir
    assert (code, out, error_of(err)["code"]) == (1, None, "service_unavailable")
    assert "PAMLEDGER_NATS_URL" in error_of(err)["message"]

    not_a_dir = {"PAMLEDGER_STATE_DIR": str(deep)}  # an unexpected OSError: internal_error, traceback at debug
    code, out, err = await run(service, tmp_path, "down", extra=not_a_dir)
    assert (code, out, error_of(err)["code"]) == (1, None, "internal_error")
    no_traceback(err)
    code, out, err = await run(service, tmp_path, "down", extra={**not_a_dir, "PAMLEDGER_LOG_LEVEL": "debug"})
    assert (code, out, error_of(err)["code"]) == (1, None, "internal_error")
    assert "Traceback" in err


async def test_clean_with_a_server_it_cannot_stop_answers_the_envelope_and_keeps_the_data(service: Env,
                                                                                          tmp_path: Path) -> None:
    """postmaster.pid names a live process that is no postmaster it can stop: clean deletes nothing."""
    state = tmp_path / "stuck-state"
    (state / "postgres" / "run").mkdir(parents=True)
    (state / "postgres" / "data").mkdir()
    holder = await asyncio.create_subprocess_exec(
        sys.executable, "-c", "import signal, time\nfor s in (signal.SIGINT, signal.SIGTERM):\n"
                              "    signal.signal(s, signal.SIG_IGN)\ntime.sleep(600)")
    try:
        (state / "postgres" / "data" / "postmaster.pid").write_text(f"{holder.pid}\n{state}\n0\n{free_port()}\n")
        code, out, err = await run(service, tmp_path, "clean", extra={"PAMLEDGER_STATE_DIR": str(state)})
        assert (code, out, error_of(err)["code"]) == (1, None, "service_unavailable")
        no_traceback(err)
        assert (state / "postgres" / "data" / "postmaster.pid").is_file()
    finally:
        holder.kill()
        await holder.wait()


async def test_a_reader_that_goes_away_ends_the_command_quietly_after_it_ran(service: Env, scope: str,
                                                                          client: MemoryClient, tmp_path: Path) -> None:
    """`pamledger create ... | head -c 10`: the write commits, and closing the pipe is no `internal_error`."""
    read_end, write_end = os.pipe()
    os.close(read_end)  # the reader is gone before anything is written
    try:
        proc = await asyncio.create_subprocess_exec(
            PAMLEDGER, "create", scope, "claim", '{"statement": "piped away"}', cwd=tmp_path,
            env=cli_env(service, tmp_path / "state"), stdout=write_end, stderr=asyncio.subprocess.PIPE)
    finally:
        os.close(write_end)
    _, err = await asyncio.wait_for(proc.communicate(), 120)
    assert proc.returncode == 128 + signal.SIGPIPE
    assert '"error"' not in err.decode(), err.decode()
    found = await client.query(scope, text="piped away", validation_states=["unverified"])
    assert len(found["items"]) == 1
