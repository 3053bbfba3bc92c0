"""Export and import (PAMSPEC-Core's exportable representation, 7.5, 8.2, 8.5, 17.2): a scope with versions,
relationships, partial and full redactions, suppression, a deletion and an extension type leaves one service
as a bundle and comes back into another one exactly; erased content is never in a bundle; bad bundles are
refused, naming the line, with nothing written; an import repeated changes nothing and says so.

Two services on the session's servers: `env` (the source) and a second database and stream (the target).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from pamledger.bundle import check_bundle, export_bundle, import_bundle
from pamledger_client.client import MemoryClient, PamspecError
from schemas.bundle import REPLAYED
from schemas.canonical import canonical_bytes
from tests.conftest import ACTOR, Env, fresh_database, fresh_settings, run_cli, serving, wait_for


SCOPE = "workspace:bundle-src"
OTHER = "workspace:bundle-other"
PROVENANCE = {"provenance_id": "prov:bundle", "actor": ACTOR, "activity": "bundle-test"}
pytestmark = pytest.mark.profile("PAMSPEC-Core")  # docs/implementation-report.md
EXTENSION = "com.example.bundle.note"
ERASED = f"erased{uuid.uuid4().hex[:10]}"  # content a deletion and a full redaction erase
HIDDEN = f"hidden{uuid.uuid4().hex[:10]}"  # the value a partial redaction removes
SUPPRESSED = f"suppressed{uuid.uuid4().hex[:10]}"  # content a suppressing redaction hides (kept in storage)


@dataclass
class World:
    source: Env
    target: Env
    src: MemoryClient
    dst: MemoryClient
    bundle: Path
    export: dict[str, Any]
    tmp: Path


async def _write(client: MemoryClient) -> None:
    await client.create_scope(SCOPE)
    await client.create_scope(OTHER)
    claim = await client.create(SCOPE, "claim", {"statement": "kept", "detail": {"n": 1}}, ACTOR, PROVENANCE,
                                object_id="mem:bundle:claim")
    updated = await client.update(SCOPE, claim["object_id"], claim["version_id"],
                                  {"statement": "kept, updated", "detail": {"n": 2.5, "who": "alice"}}, ACTOR, PROVENANCE)
    await client.transition(SCOPE, claim["object_id"], updated["version_id"], "validation", "corroborated",
                            ACTOR, PROVENANCE)
    partial = await client.create(SCOPE, "claim", {"statement": "partly", "detail": {"secret": HIDDEN}}, ACTOR,
                                  PROVENANCE, object_id="mem:bundle:partial")
    await client.redact(SCOPE, partial["object_id"], partial["version_id"], ACTOR, PROVENANCE, "test policy",
                        pointers=["/detail/secret"])
    gone = await client.create(SCOPE, "observation", {"statement": ERASED}, ACTOR, PROVENANCE,
                               object_id="mem:bundle:deleted")
    await client.delete(SCOPE, gone["object_id"], gone["version_id"], ACTOR, PROVENANCE)
    redacted = await client.create(SCOPE, "claim", {"statement": ERASED + " again"}, ACTOR, PROVENANCE,
                                   object_id="mem:bundle:redacted")
    await client.redact(SCOPE, redacted["object_id"], redacted["version_id"], ACTOR, PROVENANCE, "test policy")
    suppressed = await client.create(SCOPE, "claim", {"statement": SUPPRESSED}, ACTOR, PROVENANCE,
                                     object_id="mem:bundle:suppressed")
    await client.redact(SCOPE, suppressed["object_id"], suppressed["version_id"], ACTOR, PROVENANCE,
                        "test policy", erase=False)
    note = await client.create(SCOPE, EXTENSION, {"anything": ["goes", 1, None, True]}, ACTOR, PROVENANCE,
                               object_id="mem:bundle:note", schema_id="urn:example:bundle-note")
    await client.relate(SCOPE, claim["object_id"], note["object_id"], "com.example.annotates", ACTOR, PROVENANCE,
                        relationship_id="rel:bundle:1", canonical_content={"why": "because"})
    there = await client.create(OTHER, "claim", {"statement": "elsewhere"}, ACTOR, PROVENANCE,
                                object_id="mem:bundle:there")
    await client.relate(SCOPE, claim["object_id"], there["object_id"], "supports", ACTOR, PROVENANCE,
                        relationship_id="rel:bundle:2", target_scope_id=OTHER, policy_basis="test policy")


@contextlib.asynccontextmanager
async def _target(source: Env) -> AsyncIterator[Env]:
    target = Env(source.servers, fresh_database(source.servers, "bundle_dst"), fresh_settings("bundle_dst"))
    async with serving(target):
        yield target


@pytest.fixture(scope="module")
async def world(env: Env, tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[World]:
    tmp = tmp_path_factory.mktemp("bundle")
    async with serving(env) as src, _target(env) as target:
        async with await MemoryClient.connect(target.nats_url, target.settings.subject_prefix) as dst:
            await _write(src)
            bundle = tmp / "scope.pamb"
            with bundle.open("wb") as out:
                summary = await export_bundle(src, SCOPE, out)
            yield World(env, target, src, dst, bundle, summary, tmp)


def lines(path: Path) -> list[dict[str, Any]]:
    return [json.loads(raw) for raw in path.read_bytes().splitlines()]


def comparable(path: Path) -> tuple[list[Any], list[Any]]:
    """A bundle's versions and replayed events, without what names a ledger position (ledger_sequence, an
    event-only entry's sequence) and without the entry an import adds."""
    versions, events = [], []
    for line in lines(path)[1:-1]:
        if line["kind"] == "version":
            versions.append(line["envelope"])
        elif line["kind"] == "event" and line["event"]["event_type"] in REPLAYED:
            event = dict(line["event"])
            if "version_id" not in event:
                event.pop("sequence")
            events.append(event)
    return versions, events


async def test_the_bundle_has_its_header_entries_and_trailer(world: World) -> None:
    all_lines = lines(world.bundle)
    header, trailer = all_lines[0], all_lines[-1]
    assert header["kind"] == "header" and header["format"] == "pamledger-bundle" and header["format_version"] == 1
    assert header["scope"]["scope_id"] == SCOPE and header["watermark"] == world.export["watermark"]
    assert header["source_ledger_id"] == world.export["source_ledger_id"]
    assert trailer["kind"] == "trailer" and trailer["sha256"] == world.export["bundle_digest"]
    kinds = [line["kind"] for line in all_lines[1:-1]]
    assert trailer["counts"] == {"versions": kinds.count("version"), "events": kinds.count("event"), "vectors": 0,
                                 "lines": len(all_lines) - 1}
    assert kinds.count("version") == 14  # 3 + 2 + 2 + 2 + 2 + 1 + 1 + 1: every version of the scope
    checked = check_bundle(world.bundle)
    assert checked.bundle_digest == trailer["sha256"]


async def test_versions_are_what_history_returns(world: World) -> None:
    by_object: dict[str, list[bytes]] = {}
    for line in lines(world.bundle):
        if line["kind"] == "version":
            envelope = line["envelope"]
            name = envelope.get("object_id") or envelope["relationship_id"]
            by_object.setdefault(name, []).append(canonical_bytes(envelope))
    for name, envelopes in by_object.items():
        history = await world.src.history(SCOPE, name)
        assert [canonical_bytes(v) for v in history["versions"]] == envelopes, name


async def test_erased_and_suppressed_content_is_not_in_the_bundle(world: World) -> None:
    data = world.bundle.read_bytes()
    assert ERASED.encode() not in data and HIDDEN.encode() not in data and SUPPRESSED.encode() not in data
    assert b"kept, updated" in data  # the control: live content is there


async def test_round_trip_into_another_service_is_exact(world: World) -> None:
    result = await import_bundle(world.dst, world.bundle, ACTOR)
    assert result["result"] == "imported" and result["scope_id"] == SCOPE
    assert result["not_replayed"] == {}
    again = world.tmp / "again.pamb"
    with again.open("wb") as out:
        await export_bundle(world.dst, SCOPE, out)
    assert comparable(again) == comparable(world.bundle)
    reexported = lines(again)
    imported = [line["event"] for line in reexported if line["kind"] == "event"
                and line["event"]["event_type"] not in REPLAYED]
    assert len(imported) == 1 and imported[0]["payload"]["action"] == "scope_imported"
    assert imported[0]["payload"]["bundle_digest"] == world.export["bundle_digest"]
    assert imported[0]["payload"]["source_ledger_id"] == world.export["source_ledger_id"]
    read = await world.dst.read(SCOPE, "mem:bundle:claim")
    assert read["canonical_content"]["statement"] == "kept, updated" and read["validation_state"] == "corroborated"
    note = await world.dst.read(SCOPE, "mem:bundle:note")
    assert note["object_type"] == EXTENSION and note["schema_id"] == "urn:example:bundle-note"
    with pytest.raises(PamspecError) as gone:
        await world.dst.read(SCOPE, "mem:bundle:deleted")
    assert gone.value.code == "object_deleted"
    partial = await world.dst.read(SCOPE, "mem:bundle:partial")
    assert partial["availability_state"] == "partially_redacted" and HIDDEN not in json.dumps(partial)


async def test_the_imported_ledger_verifies_and_the_projection_serves_it(world: World) -> None:
    verify = await asyncio.to_thread(run_cli, world.target, "verify")
    assert verify.returncode == 0, verify.stdout + verify.stderr
    assert json.loads(verify.stdout)["ok"] is True

    async def projected() -> bool:
        found = await world.dst.query(SCOPE, object_types=["claim"])
        return [item["envelope"]["object_id"] for item in found["items"]] == ["mem:bundle:claim"]  # trusted only
    await wait_for(projected, timeout=30)


async def test_importing_the_same_bundle_again_changes_nothing_and_says_so(world: World) -> None:
    before = await world.dst.events(SCOPE, limit=1000)
    result = await import_bundle(world.dst, world.bundle, ACTOR)
    assert result["result"] == "already_imported" and result["entries_written"] == 0
    after = await world.dst.events(SCOPE, limit=1000)
    assert after["events"] == before["events"]


async def test_into_another_scope_of_the_same_ledger_ids_are_never_reused(world: World) -> None:
    with pytest.raises(PamspecError) as refused:
        await import_bundle(world.src, world.bundle, ACTOR, scope_id="workspace:bundle-copy")
    assert refused.value.code == "invalid_object" and refused.value.details["rule"] == "version_id_reuse"
    with pytest.raises(PamspecError) as missing:
        await world.src.events("workspace:bundle-copy")
    assert missing.value.code == "scope_not_found"  # the refused first chunk made no scope


async def test_a_remapped_import_maps_the_scope_and_relationship_targets(world: World) -> None:
    async with _target(world.source) as third:
        async with await MemoryClient.connect(third.nats_url, third.settings.subject_prefix) as client:
            await client.create_scope("workspace:mapped-other")
            result = await import_bundle(client, world.bundle, ACTOR, scope_id="workspace:mapped",
                                         scope_map={OTHER: "workspace:mapped-other"})
            assert result["scope_map"] == {SCOPE: "workspace:mapped", OTHER: "workspace:mapped-other"}
            rel = await client.read("workspace:mapped", "rel:bundle:2")
            assert rel["scope_id"] == "workspace:mapped" and rel["target_scope_id"] == "workspace:mapped-other"
            events = await client.events("workspace:mapped", limit=1000)
            record = events["events"][-1]["event"]["payload"]
            assert record["action"] == "scope_imported" and record["scope_map"] == result["scope_map"]


async def test_an_import_goes_into_a_new_or_empty_scope_only(world: World) -> None:
    async with _target(world.source) as fourth:
        async with await MemoryClient.connect(fourth.nats_url, fourth.settings.subject_prefix) as client:
            await client.create_scope(SCOPE)
            await client.create(SCOPE, "claim", {"statement": "already here"}, ACTOR, PROVENANCE)
            with pytest.raises(PamspecError) as refused:
                await import_bundle(client, world.bundle, ACTOR)
            assert refused.value.code == "invalid_request" and refused.value.details["rule"] == "import.scope_not_empty"
            assert len((await client.events(SCOPE))["events"]) == 1


def _edited(world: World, name: str, change: Any) -> Path:
    raw = world.bundle.read_bytes().splitlines(keepends=True)
    path = world.tmp / name
    path.write_bytes(b"".join(change(raw)))
    return path


def _refusal(path: Path) -> dict[str, Any]:
    with pytest.raises(PamspecError) as refused:
        check_bundle(path)
    assert refused.value.code == "invalid_request"
    return refused.value.details


def _replace_line(raw: list[bytes], index: int, old: bytes, new: bytes) -> list[bytes]:
    assert old in raw[index]
    return [*raw[:index], raw[index].replace(old, new), *raw[index + 1:]]


def test_bad_bundles_are_refused_naming_the_line(world: World) -> None:
    truncated = _refusal(_edited(world, "truncated.pamb", lambda raw: raw[:-1]))
    assert "truncated" in truncated["reason"]
    cut = _refusal(_edited(world, "cut.pamb", lambda raw: [*raw[:-2], raw[-2][:20]]))
    assert cut["line"] == len(world.bundle.read_bytes().splitlines()) - 1
    edited = _refusal(_edited(world, "edited.pamb", lambda raw: _replace_line(raw, 1, b"kept", b"kipt")))
    assert edited["line"] == 2 and "digest" in edited["reason"]  # the content no longer matches its event's
    header = _refusal(_edited(world, "header.pamb", lambda raw: _replace_line(raw, 0, b'"exported_at":"2', b'"exported_at":"1')))
    assert header["line"] == len(world.bundle.read_bytes().splitlines()) and "sha256" in header["reason"]
    foreign = _refusal(_edited(world, "foreign.pamb", lambda raw: _replace_line(
        raw, 0, b'"format":"pamledger-bundle"', b'"format":"mem0-export"')))
    assert foreign["line"] == 1 and "format" in foreign["reason"]
    future = _refusal(_edited(world, "future.pamb", lambda raw: _replace_line(
        raw, 0, b'"format_version":1', b'"format_version":99')))
    assert future["line"] == 1 and "version 99" in future["reason"]
    not_json = _refusal(_edited(world, "garbage.pamb", lambda raw: [*raw[:3], b"{nope\n", *raw[3:]]))
    assert not_json["line"] == 4
    endless = world.tmp / "endless.pamb"
    endless.write_bytes(world.bundle.read_bytes().splitlines(keepends=True)[0] + b"[" * (3 * 1024 * 1024))
    assert _refusal(endless) == {"line": 2, "reason": "longer than 2097152 bytes"}
    empty = world.tmp / "empty.pamb"
    empty.write_bytes(b"")
    assert _refusal(empty)["line"] == 1


def test_an_edit_with_a_recomputed_digest_is_still_refused(world: World) -> None:
    """Whoever recomputes the trailer still cannot change content: it no longer matches the event's digest."""
    raw = world.bundle.read_bytes().splitlines(keepends=True)
    index = next(i for i, line in enumerate(raw) if b'"kind":"version"' in line and b"kept, updated" in line)
    raw[index] = raw[index].replace(b"kept, updated", b"kept, forged!")
    body = b"".join(raw[:-1])
    trailer = json.loads(raw[-1])
    trailer["sha256"] = "sha256:" + hashlib.sha256(body).hexdigest()
    forged = world.tmp / "forged.pamb"
    forged.write_bytes(body + canonical_bytes(trailer) + b"\n")
    details = _refusal(forged)
    assert details["line"] == index + 1 and "digest" in details["reason"]


async def test_a_refused_bundle_writes_nothing(world: World) -> None:
    truncated = _edited(world, "truncated2.pamb", lambda raw: raw[:-1])
    with pytest.raises(PamspecError):
        await import_bundle(world.dst, truncated, ACTOR, scope_id="workspace:never")
    with pytest.raises(PamspecError) as missing:
        await world.dst.events("workspace:never")
    assert missing.value.code == "scope_not_found"


async def test_the_cli_exports_and_imports(world: World) -> None:
    out = world.tmp / "cli.pamb"
    exported = await asyncio.to_thread(run_cli, world.source, "export", SCOPE, "--out", str(out))
    assert exported.returncode == 0, exported.stderr
    assert json.loads(exported.stdout)["out"] == str(out)
    assert '"progress"' in exported.stderr
    assert comparable(out) == comparable(world.bundle)
    imported = await asyncio.to_thread(run_cli, world.target, "import", str(out), "--scope", "workspace:cli-imported")
    assert imported.returncode != 0  # the same ids are already in the target's ledger (the first import)
    assert json.loads(imported.stderr.strip().splitlines()[-1])["error"]["code"] == "invalid_object"
    bad = await asyncio.to_thread(run_cli, world.target, "import", str(world.tmp / "truncated.pamb"))
    assert bad.returncode != 0 and "truncated" in bad.stderr


async def test_an_unknown_scope_is_scope_not_found_for_every_part(world: World) -> None:
    for part in ({"part": "header"}, {"part": "entries", "at_sequence": 1}):
        with pytest.raises(PamspecError) as missing:
            await world.src.query_request("export", {"scope_id": "workspace:nowhere", **part})
        assert missing.value.code == "scope_not_found", part
