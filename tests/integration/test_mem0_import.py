"""`pamledger import --from mem0` against the real service: the fixture's memories arrive as the versions
docs/mem0.md describes, a second run writes nothing and says so, and a bad file writes nothing at all.

Why through the CLI process: the import is a client like any other (SDK over NATS), and what a user sees is
its stdout report, its stderr progress and error envelope, and its exit code.
"""

from __future__ import annotations

import asyncio
import copy
import json
from pathlib import Path
from typing import Any

import psycopg
import pytest

from pamledger_client.client import MemoryClient, PamspecError
from tests.conftest import Env, run_cli
from tests.fixtures.mem0_export import EXPORT, GONE, HIKING, MOVED, SEAT, STEPS, write_export

IMPORTER = "actor:human:importer"
ARGS = ("--scope", "workspace:mem0", "--user-scope-prefix", "user:", "--actor-id", IMPORTER)


async def _import(env: Env, path: Path, *extra: str) -> tuple[int, dict[str, Any] | None, str]:
    """The CLI in a thread: the service answers from this test's event loop meanwhile."""
    done = await asyncio.to_thread(run_cli, env, "import", "--from", "mem0", str(path), *ARGS, *extra)
    assert "Traceback" not in done.stderr, done.stderr
    return done.returncode, json.loads(done.stdout) if done.stdout.strip() else None, done.stderr


async def _head(env: Env) -> int:
    async with await psycopg.AsyncConnection.connect(env.database_url) as conn:
        row = await (await conn.execute("SELECT coalesce(max(ledger_sequence), 0) FROM ledger")).fetchone()
    return int(row[0]) if row else 0


@pytest.fixture(scope="module")
async def imported(service: Env, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    path = write_export(tmp_path_factory.mktemp("mem0") / "export.json")
    code, report, stderr = await _import(service, path)
    assert code == 0, stderr
    assert report is not None
    return {"path": path, "report": report, "stderr": stderr}


async def test_the_fixture_arrives_as_objects_and_versions(imported: dict[str, Any]) -> None:
    report = imported["report"]
    assert report["objects"] == {"created": 5, "already_present": 0}
    assert report["versions"] == {"created": 8, "already_present": 0}
    assert (report["tombstones"], report["changed"], report["failed"]) == (1, True, [])
    assert {s["scope_id"] for s in report["scopes"]} == {"user:alice", "user:bob", "workspace:mem0"}
    progress = [json.loads(line)["progress"] for line in imported["stderr"].splitlines()
                if line.startswith('{"progress"')]  # progress on stderr, as JSON lines like export's
    assert progress[0]["planned_memories"] == 5 and progress[0]["planned_versions"] == 8
    assert progress[-1]["memories_done"] == progress[-1]["of"] == 5


async def test_history_becomes_versions_with_mem0_times_observed_and_the_service_committing(
        client: MemoryClient, imported: dict[str, Any]) -> None:
    history = await client.history("user:alice", f"mem:mem0:{HIKING}")
    first, second = history["versions"]
    assert [v["canonical_content"]["statement"] for v in (first, second)] == [
        "Likes hiking", "Likes hiking and climbing"]
    assert second["observed_at"] == "2025-03-08T18:30:00.500000-08:00"  # the update's updated_at, as Mem0 wrote it
    assert second["committed_at"] > "2026"  # commit time is the service's, never Mem0's
    assert second["actor"]["actor_id"] == IMPORTER
    provenance = second["provenance"]
    assert (provenance["source_ref"], provenance["activity"]) == (f"mem0:memory:{HIKING}", "mem0:update")
    assert "mem0:user_id=alice" in provenance["evidence_refs"]
    assert second["canonical_content"]["mem0"]["metadata"] == {"category": "hobbies", "confidence": "high"}


async def test_types_scopes_and_the_deleted_memory(client: MemoryClient, imported: dict[str, Any]) -> None:
    assert (await client.read("user:alice", f"mem:mem0:{SEAT}"))["object_type"] == "claim"
    steps = await client.read("workspace:mem0", f"mem:mem0:{STEPS}")
    assert (steps["object_type"], steps["canonical_content"]["text"]) == (
        "observation", "Booked the train after checking three fares")
    moved = await client.read("user:alice", f"mem:mem0:{MOVED}")
    assert (moved["sequence"], moved["canonical_content"]["statement"]) == (2, "Lives in Lisbon")
    with pytest.raises(PamspecError) as caught:
        await client.read("user:bob", f"mem:mem0:{GONE}")
    assert caught.value.code == "object_deleted"
    tombstone = (await client.history("user:bob", f"mem:mem0:{GONE}"))["versions"][-1]
    assert (tombstone["availability_state"], tombstone["provenance"]["activity"]) == ("deleted", "mem0:delete")


async def test_a_second_run_writes_nothing_and_says_so(service: Env, imported: dict[str, Any]) -> None:
    before = await _head(service)
    code, report, stderr = await _import(service, imported["path"])
    assert code == 0, stderr
    assert report is not None
    assert report["objects"] == {"created": 0, "already_present": 5}
    assert report["versions"] == {"created": 0, "already_present": 8}
    assert report["changed"] is False and not any(s["created"] for s in report["scopes"])
    assert await _head(service) == before


async def test_a_malformed_file_is_refused_naming_the_memory_and_writes_nothing(
        service: Env, client: MemoryClient, tmp_path: Path) -> None:
    export = copy.deepcopy(EXPORT)
    export["results"][0]["id"] = "0f0e0d0c-new-good-memory"
    export["results"][1] = {**export["results"][1], "id": "0f0e0d0c-bad", "memory": "tab\u0000nul"}
    before = await _head(service)
    code, report, stderr = await _import(service, write_export(tmp_path / "bad.json", export), "--scope",
                                   "workspace:never-written")
    assert (code, report) == (1, None)
    error = json.loads(stderr.strip().splitlines()[-1])["error"]
    assert error["code"] == "invalid_request" and "0f0e0d0c-bad" in error["message"], error
    assert "NUL" in error["details"]["problems"][0]["reason"]
    assert await _head(service) == before
    with pytest.raises(PamspecError) as caught:
        await client.read("workspace:never-written", "mem:mem0:0f0e0d0c-new-good-memory")
    assert caught.value.code == "scope_not_found"


@pytest.mark.parametrize(("content", "expected"), [
    (b"{not json", "not a JSON document"), (b'{"results": [{"id": "a", "memory": NaN}]}', "not a JSON document"),
    (b'{"memories": []}', "no 'results' list"), (b'"just a string"', "top level is a JSON str"),
])
async def test_what_is_not_a_mem0_export_is_a_clean_error(service: Env, tmp_path: Path, content: bytes,
                                                          expected: str) -> None:
    path = tmp_path / "not-mem0.json"
    path.write_bytes(content)
    code, report, stderr = await _import(service, path)
    assert (code, report) == (1, None)
    error = json.loads(stderr.strip().splitlines()[-1])["error"]
    assert error["code"] == "invalid_request" and expected in error["message"], error


async def test_a_missing_file_is_a_clean_error(service: Env, tmp_path: Path) -> None:
    code, _, stderr = await _import(service, tmp_path / "absent.json")
    error = json.loads(stderr.strip().splitlines()[-1])["error"]
    assert code == 1 and "cannot read the Mem0 export" in error["message"]
