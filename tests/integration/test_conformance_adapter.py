"""The conformance adapter as the PAMSPEC harness runs it: a subprocess speaking NDJSON on its pipes.

Why: the harness only sees stdout lines, so the test drives the real `pamledger conformance-adapter`
process against the running service and checks every line it answers.
"""

from __future__ import annotations

import asyncio
from datetime import datetime, timedelta, timezone
import importlib.metadata
import json
import os
import sys
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from schemas.profiles import CLAIMED_PROFILES
from tests.conftest import ACTOR, PROVENANCE, Env

pytestmark = pytest.mark.profile(  # docs/implementation-report.md
    "PAMSPEC-Lite", "PAMSPEC-Subscribe", "PAMSPEC-Delegation")

ROOT = Path(__file__).resolve().parents[2]
TIMEOUT = 60.0  # per line; the machine is a loaded 2-core box
SCOPE = "workspace:adapter"


class AdapterProcess:
    """One adapter subprocess; stderr goes to a file so a chatty log can never block the pipes."""

    def __init__(self, proc: asyncio.subprocess.Process, stderr_path: Path):
        self.proc = proc
        self.stderr_path = stderr_path
        self._ids = 0

    @classmethod
    async def start(cls, env: Env, tmp_path: Path) -> AdapterProcess:
        stderr_path = tmp_path / f"adapter-{uuid.uuid4().hex[:6]}.stderr"
        # The adapter's own settings default to auth enforced, so it writes through a stand-in client per
        # harness actor even though this module's service runs with auth off: both paths stay exercised.
        child_env = {**os.environ, "PAMLEDGER_NATS_URL": env.nats_url, "PAMLEDGER_DATABASE_URL": env.database_url,
                     "PAMLEDGER_SUBJECT_PREFIX": env.settings.subject_prefix}
        with stderr_path.open("wb") as stderr:
            proc = await asyncio.create_subprocess_exec(
                sys.executable, "-m", "pamledger", "conformance-adapter", cwd=ROOT, env=child_env,
                stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE, stderr=stderr,
                limit=16 * 1024 * 1024,
            )
        return cls(proc, stderr_path)

    async def read_line(self) -> dict[str, Any]:
        assert self.proc.stdout is not None
        line = await asyncio.wait_for(self.proc.stdout.readline(), TIMEOUT)
        assert line.endswith(b"\n"), f"adapter closed stdout; stderr: {self.stderr_path.read_text()[-2000:]}"
        message = json.loads(line)
        assert isinstance(message, dict)
        return message

    async def send_raw(self, line: bytes) -> dict[str, Any]:
        assert self.proc.stdin is not None
        self.proc.stdin.write(line + b"\n")
        await self.proc.stdin.drain()
        return await self.read_line()

    async def call(self, operation: str, **arguments: Any) -> dict[str, Any]:
        """Send one request; return the whole response line after checking it echoes the request_id."""
        self._ids += 1
        request_id = f"req-{self._ids}"
        line = json.dumps({"request_id": request_id, "operation": operation, "arguments": arguments})
        response = await self.send_raw(line.encode())
        assert response["request_id"] == request_id
        assert ("result" in response) != ("error" in response), response
        return response

    async def ok(self, operation: str, **arguments: Any) -> Any:
        response = await self.call(operation, **arguments)
        assert "result" in response, response
        return response["result"]

    async def close(self) -> int:
        """Close stdin (the harness's shutdown signal) and return the exit status."""
        assert self.proc.stdin is not None
        if not self.proc.stdin.is_closing():
            self.proc.stdin.close()
        try:
            return await asyncio.wait_for(self.proc.wait(), TIMEOUT)
        except asyncio.TimeoutError:
            self.proc.kill()
            await self.proc.wait()
            raise


@pytest.fixture
async def adapter(service: Env, tmp_path: Path) -> AsyncIterator[AdapterProcess]:
    proc = await AdapterProcess.start(service, tmp_path)
    hello = await proc.read_line()
    assert hello["type"] == "hello"
    yield proc
    if proc.proc.returncode is None:
        await proc.close()


def _assert_error(response: dict[str, Any], code: str, retryable: bool = False) -> dict[str, Any]:
    error = response["error"]
    assert set(error) == {"code", "message", "retryable", "details"}
    assert error["code"] == code, error
    assert error["retryable"] is retryable
    assert isinstance(error["message"], str) and isinstance(error["details"], dict)
    return error  # type: ignore[no-any-return]


async def test_hello_is_the_first_line_and_names_the_protocol_and_profile(service: Env, tmp_path: Path) -> None:
    proc = await AdapterProcess.start(service, tmp_path)
    hello = await proc.read_line()
    version = importlib.metadata.version("pamledger")
    assert hello == {
        "type": "hello",
        "protocol_version": 1,
        "adapter": {"name": "pamledger-conformance-adapter", "version": version},
        "implementation": {"name": "pamledger", "version": version},
        "profiles_supported": list(CLAIMED_PROFILES),
    }
    assert await proc.close() == 0


async def test_lite_lifecycle_runs_end_to_end_through_the_adapter(adapter: AdapterProcess) -> None:
    scope = f"{SCOPE}:{uuid.uuid4().hex[:8]}"
    created = await adapter.ok("create", scope_id=scope, object_type="claim",
                               canonical_content={"statement": "adapters speak NDJSON"}, actor=ACTOR,
                               provenance=PROVENANCE, validation_state="corroborated")
    assert set(created) == {"object_id", "version_id", "sequence", "envelope"}
    assert created["sequence"] == 1 and created["envelope"]["lifecycle_state"] == "active"
    object_id, v1 = created["object_id"], created["version_id"]

    read = await adapter.ok("read", scope_id=scope, object_id=object_id)
    assert read == created["envelope"]

    updated = await adapter.ok("update", scope_id=scope, object_id=object_id, expected_version_id=v1,
                               canonical_content={"statement": "adapters still speak NDJSON"}, actor=ACTOR,
                               provenance=PROVENANCE)
    assert updated["sequence"] == 2
    assert updated["envelope"]["canonical_content"] == {"statement": "adapters still speak NDJSON"}

    moved = await adapter.ok("transition", scope_id=scope, object_id=object_id,
                             expected_version_id=updated["version_id"], dimension="lifecycle",
                             target_state="deprecated", actor=ACTOR, provenance=PROVENANCE)
    assert moved["sequence"] == 3 and moved["envelope"]["lifecycle_state"] == "deprecated"

    history = await adapter.ok("history", scope_id=scope, object_id=object_id)
    assert [v["version_id"] for v in history] == [v1, updated["version_id"], moved["version_id"]]
    assert [v["sequence"] for v in history] == [1, 2, 3]

    deleted = await adapter.ok("delete", scope_id=scope, object_id=object_id,
                               expected_version_id=moved["version_id"], actor=ACTOR, provenance=PROVENANCE)
    assert set(deleted) == {"object_id", "version_id", "envelope"}
    assert deleted["envelope"]["availability_state"] == "deleted"

    _assert_error(await adapter.call("read", scope_id=scope, object_id=object_id), "object_deleted")


async def test_query_returns_current_versions_newest_first_with_default_trusted_filters(
    adapter: AdapterProcess,
) -> None:
    scope = f"{SCOPE}:{uuid.uuid4().hex[:8]}"

    async def create(object_type: str, validation: str, **extra: Any) -> Any:
        return await adapter.ok("create", scope_id=scope, object_type=object_type, canonical_content={"n": 1},
                                actor=ACTOR, provenance=PROVENANCE, validation_state=validation, **extra)

    first = await create("claim", "corroborated")
    second = await create("decision", "corroborated")
    await create("claim", "unverified")  # filtered out by the default validation_state
    gone = await create("claim", "corroborated")
    await adapter.ok("delete", scope_id=scope, object_id=gone["object_id"], expected_version_id=gone["version_id"],
                     actor=ACTOR, provenance=PROVENANCE)
    touched = await adapter.ok("update", scope_id=scope, object_id=first["object_id"],
                               expected_version_id=first["version_id"], canonical_content={"n": 2}, actor=ACTOR,
                               provenance=PROVENANCE)

    results = await adapter.ok("query", scope_id=scope)
    assert [e["version_id"] for e in results] == [touched["version_id"], second["version_id"]]
    assert results[0] == touched["envelope"]
    claims = await adapter.ok("query", scope_id=scope, object_type="claim", limit=10)
    assert [e["object_id"] for e in claims] == [first["object_id"]]
    unfiltered = await adapter.ok("query", scope_id=scope, validation_state=None, availability_state=None)
    assert len(unfiltered) == 4
    assert await adapter.ok("query", scope_id=scope, limit=1) == [touched["envelope"]]


async def test_working_memory_defaults_to_scratch_unless_the_harness_names_a_lifecycle(
    adapter: AdapterProcess,
) -> None:
    content = {"task_ref": "task:adapter:1", "content": {"note": "n"}}
    omitted = await adapter.ok("create", scope_id=SCOPE, object_type="working_memory", canonical_content=content,
                               actor=ACTOR, provenance=PROVENANCE)
    explicit = await adapter.ok("create", scope_id=SCOPE, object_type="working_memory", canonical_content=content,
                                actor=ACTOR, provenance=PROVENANCE, lifecycle_state="candidate")
    assert omitted["envelope"]["lifecycle_state"] == "scratch"
    assert explicit["envelope"]["lifecycle_state"] == "candidate"


async def test_protocol_errors_are_invalid_request(adapter: AdapterProcess) -> None:
    unknown = await adapter.call("obliterate_universe", scope_id=SCOPE)
    _assert_error(unknown, "invalid_request")

    malformed = await adapter.send_raw(b"{this is not json")
    assert malformed["request_id"] is None
    _assert_error(malformed, "invalid_request")

    no_operation = await adapter.send_raw(json.dumps({"request_id": "x-1", "arguments": {}}).encode())
    assert no_operation["request_id"] == "x-1"
    _assert_error(no_operation, "invalid_request")

    no_id = await adapter.send_raw(json.dumps({"operation": "read", "arguments": {}}).encode())
    assert no_id["request_id"] is None
    _assert_error(no_id, "invalid_request")

    missing = _assert_error(await adapter.call("read", scope_id=SCOPE), "invalid_request")
    assert missing["details"]["missing"] == ["object_id"]
    extra = _assert_error(await adapter.call("read", scope_id=SCOPE, object_id="mem:x", colour="red"),
                          "invalid_request")
    assert extra["details"]["unknown"] == ["colour"]
    _assert_error(await adapter.call("query", scope_id=SCOPE, limit="ten"), "invalid_request")

    still_serving = await adapter.call("read", scope_id=SCOPE, object_id="mem:absent:1")
    _assert_error(still_serving, "object_not_found")


async def test_stale_expected_version_is_a_retryable_version_conflict_naming_the_current_version(
    adapter: AdapterProcess,
) -> None:
    created = await adapter.ok("create", scope_id=SCOPE, object_type="task", canonical_content={"title": "t"},
                               actor=ACTOR, provenance=PROVENANCE)
    updated = await adapter.ok("update", scope_id=SCOPE, object_id=created["object_id"],
                               expected_version_id=created["version_id"], canonical_content={"title": "t2"},
                               actor=ACTOR, provenance=PROVENANCE)
    stale = await adapter.call("update", scope_id=SCOPE, object_id=created["object_id"],
                               expected_version_id=created["version_id"], canonical_content={"title": "t3"},
                               actor=ACTOR, provenance=PROVENANCE)
    error = _assert_error(stale, "version_conflict", retryable=True)
    assert error["details"]["current_version_id"] == updated["version_id"]


async def test_adapter_exits_zero_when_stdin_closes(adapter: AdapterProcess) -> None:
    await adapter.ok("read", scope_id=SCOPE, object_id=(await adapter.ok(
        "create", scope_id=SCOPE, object_type="observation", canonical_content="seen", actor=ACTOR,
        provenance=PROVENANCE))["object_id"])
    assert await adapter.close() == 0
    assert adapter.proc.stdout is not None
    assert await adapter.proc.stdout.read() == b""  # nothing after the last answer


async def test_subscribe_poll_and_close_through_the_adapter(adapter: AdapterProcess) -> None:
    """[M3] subscribe → poll_subscription → close_subscription, poll-mode over the harness protocol."""
    scope = "workspace:adapter-subs"
    opened = await adapter.ok("subscribe", scope_id=scope, actor=ACTOR,
                              filter_spec={"event_classes": ["object_created"]}, after_sequence=0)
    made = await adapter.ok("create", scope_id=scope, object_type="claim", canonical_content={"s": 1},
                            actor=ACTOR, provenance=PROVENANCE)
    polled = await adapter.ok("poll_subscription", subscription_id=opened["subscription_id"], max_events=10)
    assert [e["object_id"] for e in polled["events"]] == [made["object_id"]]
    assert await adapter.ok("close_subscription", subscription_id=opened["subscription_id"], reason="done") == {}
    assert await adapter.ok("poll_subscription", subscription_id=opened["subscription_id"]) == {"events": []}
    _assert_error(await adapter.call("subscribe", scope_id=scope, actor=ACTOR, filter_spec={"colour": 1}),
                  "invalid_request")


async def test_polled_events_carry_their_ledger_sequence(adapter: AdapterProcess) -> None:
    """A harness client resumes from the ledger_sequence of the last event it got (the reference
    implementation's events carry it)."""
    scope = "workspace:adapter-sequences"
    opened = await adapter.ok("subscribe", scope_id=scope, actor=ACTOR,
                              filter_spec={"event_classes": ["object_created"]})
    made = [await adapter.ok("create", scope_id=scope, object_type="claim", canonical_content={"s": i},
                             actor=ACTOR, provenance=PROVENANCE) for i in range(2)]
    polled = await adapter.ok("poll_subscription", subscription_id=opened["subscription_id"], max_events=10)
    assert [e["object_id"] for e in polled["events"]] == [m["object_id"] for m in made]
    sequences = [e["ledger_sequence"] for e in polled["events"]]
    assert all(isinstance(s, int) for s in sequences) and sequences == sorted(set(sequences))
    assert sequences[1] > sequences[0] > 0


async def test_close_stops_delivery_as_the_upstream_conformance_case_says(adapter: AdapterProcess) -> None:
    """PAMSPEC Subscribe case_close_stops_delivery: subscribe, close, write, poll answers no events."""
    scope = "workspace:adapter-close"
    opened = await adapter.ok("subscribe", scope_id=scope, actor=ACTOR,
                              filter_spec={"event_classes": ["object_created"]})
    assert await adapter.ok("close_subscription", subscription_id=opened["subscription_id"],
                            reason="conformance_test") == {}
    await adapter.ok("create", scope_id=scope, object_type="claim", canonical_content={"s": "after close"},
                     actor=ACTOR, provenance=PROVENANCE)
    assert await adapter.ok("poll_subscription", subscription_id=opened["subscription_id"]) == {"events": []}


async def test_delegations_are_granted_checked_and_revoked_through_the_adapter(adapter: AdapterProcess) -> None:
    """The PAMSPEC-Delegation profile's observable rules: the grant back, window, usage, objects, revoke."""
    scope = f"{SCOPE}:{uuid.uuid4().hex[:8]}"
    supervisor = {"actor_id": "actor:agent:supervisor", "actor_kind": "agent"}
    worker = {"actor_id": "actor:agent:worker-01", "actor_kind": "agent"}
    now = datetime.now(timezone.utc)
    window = {"not_before": (now - timedelta(minutes=1)).isoformat(), "not_after": (now + timedelta(hours=1)).isoformat()}
    base = {"scope_id": scope, "granting_actor": supervisor, "delegated_actor": worker,
            "policy_basis": "policy:multi-agent-handoff-v1", **window}
    granted = await adapter.ok("grant_delegation", **base, granted_operations=["read", "update"], usage_limit=2,
                               granted_object_ids=["mem:task-1"])
    assert granted["granted_operations"] == ["read", "update"] and granted["usage_limit"] == 2
    check = {"delegation_id": granted["delegation_id"], "scope_id": scope, "delegated_actor_id": worker["actor_id"]}
    assert (await _check(adapter, check, "read", object_id="mem:task-1"))[
        "delegation_id"] == granted["delegation_id"]
    _assert_error(await _check(adapter, check, "read", object_id="mem:other", ok=False),
                  "access_denied")
    _assert_error(await _check(adapter, check, "delete", ok=False), "access_denied")
    await _check(adapter, check, "update")
    _assert_error(await _check(adapter, check, "read", ok=False), "access_denied")  # 2 uses
    other = await adapter.ok("grant_delegation", **base, granted_operations=["read"])
    assert await adapter.ok("revoke_delegation", delegation_id=other["delegation_id"]) == {}
    _assert_error(await _check(adapter, {**check, "delegation_id": other["delegation_id"]}, "read",
                                ok=False), "access_denied")
    inverted = {**base, "not_before": window["not_after"], "not_after": window["not_before"]}
    _assert_error(await adapter.call("grant_delegation", **inverted, granted_operations=["read"]), "policy_denied")


async def _check(adapter: AdapterProcess, check: dict[str, Any], operation: str, ok: bool = True, **more: Any) -> Any:
    """check_delegation (its `operation` argument would clash with AdapterProcess.call's own)."""
    adapter._ids += 1
    line = json.dumps({"request_id": f"req-{adapter._ids}", "operation": "check_delegation",
                       "arguments": {**check, "operation": operation, **more}})
    response = await adapter.send_raw(line.encode())
    return response["result"] if ok and "result" in response else response


async def test_relate_redact_and_promote_through_the_adapter(adapter: AdapterProcess) -> None:
    """[M5] The MCP binding's relate / redact / promote, with their results and their refusals."""
    scope = f"{SCOPE}:{uuid.uuid4().hex[:8]}"
    other = f"{scope}.other"

    async def claim(scope_id: str = scope) -> Any:
        return await adapter.ok("create", scope_id=scope_id, object_type="claim",
                                canonical_content={"statement": "s", "who": "ana"}, actor=ACTOR, provenance=PROVENANCE)

    a, b, elsewhere = await claim(), await claim(), await claim(other)
    related = await adapter.ok("relate", scope_id=scope, source_object_id=a["object_id"],
                               target_object_id=b["object_id"], relationship_type="supports",
                               directionality="directed", actor=ACTOR, provenance=PROVENANCE,
                               canonical_content={"weight": 1})
    assert set(related) == {"relationship_id", "version_id", "sequence", "envelope"}
    assert related["envelope"]["relationship_id"] == related["relationship_id"]
    assert await adapter.ok("read", scope_id=scope, object_id=related["relationship_id"]) == related["envelope"]
    crossing = {"scope_id": scope, "source_object_id": a["object_id"], "target_object_id": elsewhere["object_id"],
                "target_scope_id": other, "relationship_type": "references", "directionality": "undirected",
                "actor": ACTOR, "provenance": PROVENANCE}
    _assert_error(await adapter.call("relate", **crossing), "policy_denied")
    crossed = await adapter.ok("relate", **crossing, policy_basis="policy:shared")
    assert crossed["envelope"]["target_scope_id"] == other

    redacted = await adapter.ok("redact", scope_id=scope, object_id=a["object_id"], expected_version_id=a["version_id"],
                                actor=ACTOR, provenance=PROVENANCE, policy_basis="gdpr:art17",
                                redaction_target={"pointers": ["/who"]})
    assert redacted["envelope"]["canonical_content"] == {"statement": "s", "who": "[REDACTED]"}
    _assert_error(await adapter.call("redact", scope_id=scope, object_id=b["object_id"],
                                     expected_version_id=b["version_id"], actor=ACTOR, provenance=PROVENANCE,
                                     policy_basis="p", redaction_target={"fields": ["who"]}), "invalid_request")
    suppressed = await adapter.ok("redact", scope_id=scope, object_id=b["object_id"],
                                  expected_version_id=b["version_id"], actor=ACTOR, provenance=PROVENANCE,
                                  policy_basis="hold", redaction_target={"erase": False})
    restore = {"scope_id": scope, "object_id": b["object_id"], "expected_version_id": suppressed["version_id"],
               "dimension": "availability", "target_state": "available", "actor": ACTOR, "provenance": PROVENANCE}
    _assert_error(await adapter.call("transition", **restore), "policy_denied")
    restored = await adapter.ok("transition", **restore, policy_basis="restoration:1")
    assert restored["envelope"]["canonical_content"]["who"] == "ana"

    scratch = await adapter.ok("create", scope_id=scope, object_type="working_memory",
                               canonical_content={"task_ref": "task:1", "content": {}}, actor=ACTOR, provenance=PROVENANCE)
    promote = {"scope_id": scope, "target_object_type": "decision", "target_canonical_content": {"summary": "go"},
               "actor": ACTOR, "provenance": PROVENANCE}
    promoted = await adapter.ok("promote", **promote, source_object_id=scratch["object_id"],
                                expected_version_id=scratch["version_id"], target_validation_state="corroborated")
    assert set(promoted) == {"object_id", "version_id", "sequence", "envelope", "promotion"}
    assert promoted["promotion"]["source_object_id"] == scratch["object_id"]
    _assert_error(await adapter.call("promote", **promote, source_object_id=b["object_id"],
                                     expected_version_id=restored["version_id"]), "invalid_request")
