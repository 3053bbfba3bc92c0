"""A ledger of several partitions leaves and comes back whole: backup and restore (every partition's head in the
manifest and back, erasures made after the backup in any partition done again), export and import across
partition counts (a bundle's positions are its scope's partition's), and retention over the scopes of every
partition (one leader evaluates them all).

Real servers: the service runs in-process with `partitions` 4 (tests/conftest.py `serving`), the operator
commands (`backup`, `restore`, `verify`, `retention evaluate`) as real `python -m pamledger` processes.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import psycopg
import pytest

from infra.ledger import ledger_head, ledger_tail
from infra.ledger_identity import ledger_identity
from infra.partitions import partition_of
from infra.settings import RetentionSettings
from pamledger.backup import read_manifest
from pamledger.bundle import export_bundle, import_bundle
from pamledger_client.client import MemoryClient, PamspecError
from tests.conftest import ACTOR, PROVENANCE, ROOT, Env, Servers, fresh_database, fresh_settings, serving, \
    service_environment, wait_for

PARTITIONS = 4
ROLES = ("writer", "query", "projector")
PAST = (datetime.now(timezone.utc) - timedelta(days=2)).isoformat()
FAR = (datetime.now(timezone.utc) + timedelta(days=3650)).isoformat()


def scope_in(partition: int, label: str, partitions: int = PARTITIONS) -> str:
    """A scope id the hash assigns to `partition`."""
    i = 0
    while partition_of(f"workspace:{label}-{i}", partitions) != partition:
        i += 1
    return f"workspace:{label}-{i}"


def partitioned(label: str, **overrides: Any) -> Any:
    return fresh_settings(label, partitions=PARTITIONS, **overrides)


def pamledger(env: Env, *args: str, database_url: str | None = None,
              partitions: int = PARTITIONS) -> subprocess.CompletedProcess[str]:
    """`python -m pamledger ARGS` against `env` (or another database of its servers) with `partitions`."""
    return subprocess.run([sys.executable, "-m", "pamledger", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=300, env=service_environment(env, database_url,
                                                               PAMLEDGER_PARTITIONS=str(partitions)))


def error_of(done: subprocess.CompletedProcess[str]) -> dict[str, Any]:
    return dict(json.loads(done.stderr.strip().splitlines()[-1])["error"])


async def row_hash_at(database_url: str, partition: int, sequence: int) -> str | None:
    async with await psycopg.AsyncConnection.connect(database_url) as conn:
        row = await (await conn.execute("SELECT row_hash FROM ledger WHERE partition = %s AND ledger_sequence = %s",
                                        (partition, sequence))).fetchone()
    return bytes(row[0]).hex() if row else None


# Backup and restore

async def test_a_backup_taken_while_writing_restores_every_partition_and_erases_again(
        servers: Servers, tmp_path: Path) -> None:
    env = Env(servers, fresh_database(servers, "pp_backup"), partitioned("pp_backup"))
    scopes = [scope_in(p, "backup") for p in range(PARTITIONS)]
    backup = tmp_path / "backup"
    async with serving(env, ROLES, roles=ROLES) as client:
        client.retries = 3
        for scope_id in scopes:
            await client.create_scope(scope_id)
        made = {s: await client.create(s, "claim", {"statement": f"before {s}"}, ACTOR, PROVENANCE) for s in scopes}
        written, stop = [], asyncio.Event()

        async def keep_writing() -> None:  # the backup is taken while every partition is written to
            while not stop.is_set():
                scope_id = scopes[len(written) % PARTITIONS]
                written.append(await client.create(scope_id, "claim", {"n": len(written)}, ACTOR, PROVENANCE))

        loader = asyncio.create_task(keep_writing())
        await wait_for(lambda: len(written) >= 8, timeout=60)
        done = await asyncio.to_thread(pamledger, env, "backup", "--out", str(backup), "--quiet")
        stop.set()
        await loader
        assert done.returncode == 0, done.stdout + done.stderr
        # After the backup, in partitions 2 and 3: a deletion and a full (erasing) redaction.
        deleted, redacted = made[scopes[2]], made[scopes[3]]
        await client.delete(scopes[2], deleted["object_id"], deleted["version_id"], ACTOR, PROVENANCE)
        await client.redact(scopes[3], redacted["object_id"], redacted["version_id"], ACTOR, PROVENANCE, "gdpr:art17")
    manifest = json.loads((backup / "manifest.json").read_text())
    marks = manifest["partitions"]
    assert manifest["format_version"] == 2 and [m["partition"] for m in marks] == list(range(PARTITIONS))
    assert all(m["head_sequence"] > 1 and m["ledger_id"].startswith("ledger:") for m in marks), marks
    assert len({m["ledger_id"] for m in marks}) == PARTITIONS  # each partition's own ledger id
    assert manifest["ledger"] == marks[0]

    target = fresh_database(servers, "pp_restored")
    other_count = await asyncio.to_thread(pamledger, env, "restore", str(backup), "--quiet", database_url=target,
                                          partitions=2)
    assert other_count.returncode != 0 and error_of(other_count)["details"]["rule"] == "restore.partitions_differ"
    assert "PAMLEDGER_PARTITIONS=4" in error_of(other_count)["message"]
    done = await asyncio.to_thread(pamledger, env, "restore", str(backup), "--quiet", database_url=target)
    assert done.returncode == 0, done.stdout + done.stderr
    restored = json.loads(done.stdout)
    assert restored["erasures"]["verified"] is True and restored["erasures"]["refused"] == []
    assert restored["erasures"]["outcomes"] == {"deleted": 1, "redacted": 1}
    assert sorted(restored["stream"]["partitions"]) == [str(p) for p in range(PARTITIONS)]
    for mark in marks:  # the backup's head of every partition is back; 2 and 3 then took the erasures again
        head, _ = await _tail(target, mark["partition"])
        assert await row_hash_at(target, mark["partition"], mark["head_sequence"]) == mark["head_hash"], mark
        assert head == mark["head_sequence"] + (1 if mark["partition"] in (2, 3) else 0), (mark, head)
    verified = await asyncio.to_thread(pamledger, env, "verify", database_url=target)
    assert verified.returncode == 0 and json.loads(verified.stdout)["ok"], verified.stdout + verified.stderr
    assert sorted(json.loads(verified.stdout)["partitions"]) == [str(p) for p in range(PARTITIONS)]

    async with serving(Env(servers, target, env.settings), ROLES, roles=ROLES) as client:
        for scope_id in scopes[:2]:  # partitions 0 and 1 serve their backed-up objects
            found = await client.read(scope_id, made[scope_id]["object_id"])
            assert found["canonical_content"] == {"statement": f"before {scope_id}"}
            queried = await client.query(scope_id, wait_ms=10_000, validation_states=["unverified"])
            assert queried["items"], queried  # its partition's projection is served
            assert {i["envelope"]["scope_id"] for i in queried["items"]} == {scope_id}
        for scope_id, state in ((scopes[2], "deleted"), (scopes[3], "redacted")):
            history = await client.history(scope_id, made[scope_id]["object_id"])
            assert history["versions"][-1]["availability_state"] == state
            assert f"before {scope_id}" not in json.dumps(history), history  # erased from every version


async def _tail(database_url: str, partition: int) -> tuple[int, bytes | None]:
    async with await psycopg.AsyncConnection.connect(database_url) as conn:
        return await ledger_tail(conn, partition)


def test_a_manifest_of_format_1_is_read_as_one_partition_s(tmp_path: Path) -> None:
    """Backups taken before partitions (one mark, `ledger`) stay restorable."""
    mark = {"partition": 0, "ledger_id": "ledger:x", "head_sequence": 7, "head_hash": "ab" * 32}
    (tmp_path / "manifest.json").write_text(json.dumps({
        "format": "pamledger-backup", "format_version": 1, "pamledger_version": "0", "schema_version": 20,
        "taken_at": "2026-01-01T00:00:00Z", "ledger": mark,
        "database": {"file": "database.dump", "bytes": 1, "sha256": "0" * 64, "tool": "pg_dump", "server_version": "18"},
        "secrets": {"included": False, "files": [], "note": ""}}))
    manifest = read_manifest(tmp_path)
    assert [m.head_sequence for m in manifest.marks()] == [7] and manifest.partitions == []


# Export and import

async def test_a_scope_of_partition_2_exports_and_imports_across_partition_counts(
        servers: Servers, tmp_path: Path) -> None:
    many = Env(servers, fresh_database(servers, "pp_many"), partitioned("pp_many"))
    one = Env(servers, fresh_database(servers, "pp_one"), fresh_settings("pp_one"))
    source, busy = scope_in(2, "export"), scope_in(0, "busy")
    async with serving(many, ROLES, roles=ROLES) as m, serving(one, ROLES, roles=ROLES) as o:
        m.retries = o.retries = 3
        await m.create_scope(busy)  # partition 0 ahead of partition 2: their sequences differ
        for i in range(6):
            await m.create(busy, "claim", {"n": i}, ACTOR, PROVENANCE)
        await m.create_scope(source)
        first = await m.create(source, "claim", {"statement": "one"}, ACTOR, PROVENANCE)
        await m.update(source, first["object_id"], first["version_id"], {"statement": "one, again"}, ACTOR,
                       PROVENANCE)
        await m.create(source, "claim", {"statement": "two"}, ACTOR, PROVENANCE)
        bundle = tmp_path / "p2.pamb"
        with bundle.open("wb") as out:
            exported = await export_bundle(m, source, out)
        await assert_bundle_is_its_partition_s(many, bundle, source, 2)

        # (a) into another scope of the same ledger, in another partition: ids are never reused across partitions
        copy = scope_in(1, "copy")
        with pytest.raises(PamspecError) as refused:
            await import_bundle(m, bundle, ACTOR, scope_id=copy)
        assert refused.value.code == "invalid_object" and refused.value.details["rule"] == "version_id_reuse"
        with pytest.raises(PamspecError) as missing:
            await m.events(copy)
        assert missing.value.code == "scope_not_found"

        # (b) into a one-partition ledger
        imported = await import_bundle(o, bundle, ACTOR)
        assert imported["result"] == "imported" and imported["scope_id"] == source
        async with await psycopg.AsyncConnection.connect(one.database_url) as conn:
            assert o.last_sequence == await ledger_head(conn, 0)  # a chunk's reply names its last entry
        await assert_reads_its_own(o, source, {"one, again", "two"})
        assert (await import_bundle(o, bundle, ACTOR))["result"] == "already_imported"

        # (c) from a one-partition ledger into the four-partition one, landing in partition 3
        landing = scope_in(3, "from-one")
        await o.create_scope(landing)
        await o.create(landing, "claim", {"statement": "three"}, ACTOR, PROVENANCE)
        back = tmp_path / "one.pamb"
        with back.open("wb") as out:
            from_one = await export_bundle(o, landing, out)
        async with await psycopg.AsyncConnection.connect(one.database_url) as conn:
            assert from_one["watermark"] == await ledger_head(conn, 0)
        imported = await import_bundle(m, back, ACTOR)
        assert imported["result"] == "imported"
        await assert_reads_its_own(m, landing, {"three"})
        assert (await import_bundle(m, back, ACTOR))["result"] == "already_imported"
        again = tmp_path / "again.pamb"
        with again.open("wb") as out:
            await export_bundle(m, landing, out)
        await assert_bundle_is_its_partition_s(many, again, landing, 3)
    assert exported["watermark"] > 0
    verified = await asyncio.to_thread(pamledger, many, "verify")
    assert verified.returncode == 0 and json.loads(verified.stdout)["ok"], verified.stdout + verified.stderr


async def assert_bundle_is_its_partition_s(env: Env, bundle: Path, scope_id: str, partition: int) -> None:
    """The bundle's watermark is the partition's head, its source ledger the partition's id, and its entries'
    sequences the scope's rows in that partition."""
    lines = [json.loads(raw) for raw in bundle.read_bytes().splitlines()]
    header = lines[0]
    async with await psycopg.AsyncConnection.connect(env.database_url) as conn:
        head = await ledger_head(conn, partition)
        ledger_id = await ledger_identity(conn, partition)
        cur = await conn.execute("SELECT ledger_sequence FROM ledger WHERE scope_id = %s AND partition = %s"
                                 " AND ledger_sequence <= %s ORDER BY ledger_sequence", (scope_id, partition, head))
        rows = [int(r[0]) for r in await cur.fetchall()]
        cur = await conn.execute("SELECT partition FROM scopes WHERE scope_id = %s", (scope_id,))
        recorded = await cur.fetchone()
    assert recorded is not None and recorded[0] == partition == partition_of(scope_id, PARTITIONS)
    assert header["watermark"] == head and header["source_ledger_id"] == ledger_id, (header, head, ledger_id)
    assert [line["ledger_sequence"] for line in lines if line["kind"] == "event"] == rows


async def assert_reads_its_own(client: MemoryClient, scope_id: str, statements: set[str]) -> None:
    """Right after the import, a query of the scope sees what it wrote (the SDK's min_sequence)."""
    found = await client.query(scope_id, wait_ms=10_000, validation_states=["unverified"])
    assert found["min_sequence_reached"], found
    assert {i["envelope"]["canonical_content"]["statement"] for i in found["items"]} == statements, found


# Retention

async def test_the_retention_leader_expires_objects_in_every_partition(servers: Servers) -> None:
    env = Env(servers, fresh_database(servers, "pp_retention"),
              partitioned("pp_retention", retention=RetentionSettings(every_seconds=0.5)))
    scopes = [scope_in(p, "retention") for p in range(PARTITIONS)]
    expiring: dict[str, str] = {}
    kept: dict[str, str] = {}
    async with serving(env, ROLES, roles=(*ROLES, "retention")) as client:
        client.retries = 3
        for partition, scope_id in enumerate(scopes):
            await client.create_scope(scope_id)
            for i in range(3 * partition):  # each partition further ahead than partition 0
                await client.create(scope_id, "claim", {"filler": i}, ACTOR, PROVENANCE)
            kept[scope_id] = (await client.create(scope_id, "claim", {"s": "kept"}, ACTOR, PROVENANCE,
                                                  valid_until=FAR))["object_id"]
            expiring[scope_id] = (await client.create(scope_id, "claim", {"s": "old"}, ACTOR, PROVENANCE,
                                                      valid_until=PAST))["object_id"]

        async def all_expired() -> bool:
            states = [(await client.read(s, o))["retention_state"] for s, o in expiring.items()]
            return all(state == "expired" for state in states)

        try:
            await wait_for(all_expired, timeout=60, interval=0.3)
        except AssertionError:
            states = {s: (await client.read(s, o))["retention_state"] for s, o in expiring.items()}
            raise AssertionError(f"not every partition's object expired: {states}") from None
        for scope_id, object_id in kept.items():
            assert (await client.read(scope_id, object_id))["retention_state"] == "retained"


async def test_retention_evaluate_from_the_cli_proposes_in_every_partition(servers: Servers) -> None:
    env = Env(servers, fresh_database(servers, "pp_retcli"), partitioned("pp_retcli"))
    scopes = [scope_in(p, "retcli") for p in range(PARTITIONS)]
    expiring: dict[str, str] = {}
    async with serving(env, ROLES, roles=ROLES) as client:
        client.retries = 3
        for partition, scope_id in enumerate(scopes):
            await client.create_scope(scope_id)
            for i in range(3 * partition):
                await client.create(scope_id, "claim", {"filler": i}, ACTOR, PROVENANCE)
            made = await client.create(scope_id, "claim", {"s": "old"}, ACTOR, PROVENANCE, valid_until=PAST)
            expiring[made["object_id"]] = scope_id
        await wait_for(lambda: _projected(env, scopes), timeout=30)
        done = await asyncio.to_thread(pamledger, env, "retention", "evaluate", "--dry-run")
        assert done.returncode == 0, done.stdout + done.stderr
        proposed = {p["object_id"]: p for p in json.loads(done.stdout)["proposals"]}
        assert set(proposed) == set(expiring), proposed


async def _projected(env: Env, scopes: list[str]) -> bool:
    """Every partition's projection has applied its head (what the evaluator reads)."""
    async with await psycopg.AsyncConnection.connect(env.database_url) as conn:
        cur = await conn.execute(
            "SELECT count(*) FROM current_objects WHERE scope_id = ANY(%s)", (scopes,))
        row = await cur.fetchone()
    return bool(row and row[0] == sum(3 * p + 1 for p in range(PARTITIONS)))


