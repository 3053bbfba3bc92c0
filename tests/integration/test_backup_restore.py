"""Backup and restore respect erasure (PAMSPEC 17.1): a canary erased after a backup does not come back.

The module writes objects whose content holds canary words, backs up online (`pamledger backup`), erases them
after the backup (a deletion, a partial redaction of the backed-up version, a partial redaction of a later
version, an availability transition to redacted; and an object made and deleted after the backup), stops the
service and restores (`pamledger restore --replace`). Then every textual column of every table, the JetStream
stream and the vector tables are searched for the canaries, as the erasure canary test does
(tests/integration/test_erasure_canary.py). Control: a word in content nobody erased is found in the same
scans, before and after. Refusals (a running service, a database holding a ledger, a missing erasure
journal, a damaged dump) change nothing.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg
import pytest

from infra.ledger import ledger_tail
from pamledger_client.errors import PamspecError
from schemas.errors import PamledgerError
from pamledger.supervisor import ROLES as ALL_ROLES
from tests.conftest import ACTOR, Env, run_cli, serving
from tests.integration.test_erasure_canary import STATISTICS, scan_database, scan_stream, settle, word

pytestmark = pytest.mark.profile("PAMSPEC-Core")  # docs/implementation-report.md
SCOPE = "workspace:backup"
META = word("meta")  # in every write's provenance.activity: metadata the ledger, the stream and versions keep
PROV = {"provenance_id": "prov:backup", "actor": ACTOR, "activity": f"backup-test {META}"}
ERASED = ("deleted", "partial", "partial_later", "transitioned", "after")  # erased after the backup


@dataclass
class World:
    backup: Path
    canary: dict[str, str]
    kept: str  # in the partially redacted object's kept part
    control: str  # in an object nothing erases
    made: dict[str, dict[str, Any]] = field(default_factory=dict)
    manifest: dict[str, Any] = field(default_factory=dict)
    refusals: dict[str, Any] = field(default_factory=dict)
    restored: dict[str, Any] = field(default_factory=dict)
    found: dict[str, set[str]] = field(default_factory=dict)
    head_after_restore: tuple[int, bytes | None] = (0, None)

    def needles(self) -> dict[str, str]:
        return {**self.canary, "kept": self.kept, "control": self.control, "meta": META}


def cli_json(env: Env, *args: str) -> tuple[int, dict[str, Any]]:
    done = run_cli(env, *args)
    out = done.stdout if done.returncode == 0 else done.stderr.strip().splitlines()[-1]
    return done.returncode, json.loads(out)


async def _write(client: Any, w: World) -> None:
    await client.create_scope(SCOPE)
    c, m = w.canary, w.made
    m["deleted"] = await client.create(SCOPE, "claim", {"statement": f"to delete {c['deleted']}"}, ACTOR, PROV)
    m["partial"] = await client.create(SCOPE, "claim", {"statement": f"kept {w.kept}", "detail": {
        "who": c["partial"]}}, ACTOR, PROV)
    m["partial_later"] = await client.create(SCOPE, "claim", {"statement": f"first {c['partial_later']}",
                                                              "detail": {"who": "x"}}, ACTOR, PROV)
    m["transitioned"] = await client.create(SCOPE, "claim", {"statement": f"hide {c['transitioned']}"}, ACTOR, PROV)
    m["control"] = await client.create(SCOPE, "claim", {"statement": f"nobody erases {w.control}"}, ACTOR, PROV)


async def _erase_after_backup(client: Any, w: World) -> None:
    m = w.made
    await client.delete(SCOPE, m["deleted"]["object_id"], m["deleted"]["version_id"], ACTOR, PROV)
    await client.redact(SCOPE, m["partial"]["object_id"], m["partial"]["version_id"], ACTOR, PROV, "gdpr:art17",
                        pointers=["/detail/who"])
    later = await client.update(SCOPE, m["partial_later"]["object_id"], m["partial_later"]["version_id"],
                                {"statement": "second", "detail": {"who": "y"}}, ACTOR, PROV)
    await client.redact(SCOPE, m["partial_later"]["object_id"], later["version_id"], ACTOR, PROV, "gdpr:art17",
                        pointers=["/detail/who"])
    await client.transition(SCOPE, m["transitioned"]["object_id"], m["transitioned"]["version_id"], "availability",
                            "redacted", ACTOR, PROV)
    after = await client.create(SCOPE, "claim", {"statement": f"made after {w.canary['after']}"}, ACTOR, PROV)
    await client.delete(SCOPE, after["object_id"], after["version_id"], ACTOR, PROV)


@pytest.fixture(scope="module")
async def world(env: Env, tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[World]:
    w = World(backup=tmp_path_factory.mktemp("backup") / "b1", canary={s: word(s[:4]) for s in ERASED},
              kept=word("kept"), control=word("ctrl"))
    async with serving(env, ALL_ROLES, roles=ALL_ROLES) as client:
        await _write(client, w)
        await settle(env)
        code, w.manifest = cli_json(env, "backup", "--out", str(w.backup), "--quiet")
        assert code == 0, w.manifest
        await _erase_after_backup(client, w)
        await settle(env)
        w.refusals["serving"] = cli_json(env, "restore", str(w.backup), "--replace", "--quiet")
    w.refusals["occupied"] = cli_json(env, "restore", str(w.backup), "--quiet")
    code, w.restored = cli_json(env, "restore", str(w.backup), "--replace", "--quiet")
    assert code == 0, w.restored
    async with await psycopg.AsyncConnection.connect(env.database_url, autocommit=True) as conn:
        w.head_after_restore = await ledger_tail(conn, env.settings.partition)
    w.found = {**await scan_database(env.database_url, w.needles()), **await scan_stream(env, w.needles())}
    yield w


def test_the_manifest_names_the_ledger_head_and_leaves_secrets_out(world: World) -> None:
    manifest = json.loads((world.backup / "manifest.json").read_text())
    assert manifest["format"] == "pamledger-backup" and manifest["ledger"]["ledger_id"].startswith("ledger:")
    assert manifest["ledger"]["head_sequence"] > 0 and len(manifest["ledger"]["head_hash"]) == 64
    assert manifest["database"]["bytes"] == (world.backup / "database.dump").stat().st_size
    assert manifest["secrets"]["included"] is False and not (world.backup / "secrets").exists()
    assert manifest["schema_version"] >= 17


def test_restore_refuses_a_running_service_and_a_database_holding_a_ledger(world: World) -> None:
    code, error = world.refusals["serving"]
    assert code != 0 and error["error"]["details"]["rule"] == "restore.service_running"
    code, error = world.refusals["occupied"]
    assert code != 0 and error["error"]["details"]["rule"] == "restore.database_not_empty"


def test_restore_puts_the_backup_head_back_and_erases_again(world: World) -> None:
    assert world.restored["backup_head"] == world.manifest["ledger"]["head_sequence"]
    erasures = world.restored["erasures"]
    assert erasures["verified"] is True and erasures["refused"] == []
    # deleted → delete; partial of the backed-up version → the same pointers; partial of a later version and
    # the transition → full erasing redactions; the object made after the backup is not there at all.
    assert erasures["outcomes"] == {"deleted": 1, "partially_redacted": 1, "redacted": 2, "absent": 1}
    assert world.head_after_restore[0] > world.restored["backup_head"]


def test_no_canary_erased_after_the_backup_is_anywhere_after_restore(world: World) -> None:
    for shape in ERASED:
        where = sorted(store for store, names in world.found.items() if shape in names and store != STATISTICS)
        assert where == [], f"{shape}'s canary is back after restore in {where}"


def test_content_nobody_erased_is_back_whole(world: World) -> None:
    """The control: the same scans find what the restore must keep."""
    assert any("content_store" in store for store, names in world.found.items() if "control" in names)
    assert any("content_store" in store for store, names in world.found.items() if "kept" in names)
    assert "meta" in world.found.get("jetstream", set())  # the stream (content-free) was rebuilt and holds the ledger


async def test_reads_after_restore_show_the_erasures(env: Env, world: World) -> None:
    async with serving(env) as client:
        partial = await client.read(SCOPE, world.made["partial"]["object_id"])
        assert partial["availability_state"] == "partially_redacted"
        assert partial["canonical_content"]["statement"] == f"kept {world.kept}"
        assert partial["canonical_content"]["detail"]["who"] == "[REDACTED]"
        with pytest.raises(PamspecError) as redacted:  # fully redacted: read says so
            await client.read(SCOPE, world.made["partial_later"]["object_id"])
        assert redacted.value.code == "object_redacted"
        history = await client.history(SCOPE, world.made["partial_later"]["object_id"])
        assert [v.get("canonical_content") for v in history["versions"]] == [None, None]
        control = await client.read(SCOPE, world.made["control"]["object_id"])
        assert world.control in control["canonical_content"]["statement"]


def test_verify_passes_after_restore(env: Env, world: World) -> None:
    done = run_cli(env, "verify")
    assert done.returncode == 0, done.stdout + done.stderr
    assert json.loads(done.stdout)["ok"] is True


def test_a_second_restore_from_the_same_backup_erases_the_same_and_no_more(env: Env, world: World) -> None:
    """The first restore's re-applied erasures are journaled too; the originals govern, so a partial
    redaction is not made a full one the second time."""
    code, again = cli_json(env, "restore", str(world.backup), "--replace", "--quiet")
    assert code == 0, again
    assert again["erasures"]["outcomes"] == world.restored["erasures"]["outcomes"]


def test_restore_without_the_erasure_journal_refuses_unless_accepted(env: Env, world: World, tmp_path: Path) -> None:
    moved = tmp_path / "journal.jsonl"
    journal = env.settings.writer.erasure_journal
    assert journal is not None and journal.is_file()
    shutil.move(journal, moved)
    try:
        code, error = cli_json(env, "restore", str(world.backup), "--replace", "--quiet")
        assert code != 0 and error["error"]["details"]["rule"] == "restore.erasures_unverified"
    finally:
        shutil.move(moved, journal)


def test_a_damaged_dump_is_refused_before_anything_changes(env: Env, world: World, tmp_path: Path) -> None:
    damaged = tmp_path / "damaged"
    shutil.copytree(world.backup, damaged)
    with (damaged / "database.dump").open("r+b") as handle:
        handle.seek(100)
        handle.write(b"\x00\x01\x02")
    code, error = cli_json(env, "restore", str(damaged), "--replace", "--quiet")
    assert code != 0 and "sha256" in error["error"]["message"]


async def test_a_database_put_back_by_other_means_is_mended_by_erasures_only(env: Env, world: World,
                                                                            tmp_path: Path) -> None:
    """Restored without the journal (accepted, and said loudly), the canaries are back; `restore
    --erasures-only` with the journal then erases them again."""
    journal = env.settings.writer.erasure_journal
    assert journal is not None
    shutil.move(journal, tmp_path / "journal.jsonl")
    try:
        done = run_cli(env, "restore", str(world.backup), "--replace", "--accept-unverified-erasures", "--quiet")
        assert done.returncode == 0, done.stderr
        assert json.loads(done.stdout)["erasures"]["verified"] is False and "WARNING" in done.stderr
    finally:
        journal.unlink(missing_ok=True)  # what the unverified restore's writer began
        shutil.move(tmp_path / "journal.jsonl", journal)
    back = await scan_database(env.database_url, world.needles())
    assert any("deleted" in names for names in back.values())  # the control of this test: it is back
    code, mended = cli_json(env, "restore", "--erasures-only", "--quiet")
    assert code == 0, mended
    assert mended["erasures"]["outcomes"] == world.restored["erasures"]["outcomes"]
    found = await scan_database(env.database_url, world.needles())
    for shape in ERASED:
        assert not [s for s, names in found.items() if shape in names and s != STATISTICS], shape


async def test_secrets_are_in_a_backup_only_when_asked(env: Env, world: World, tmp_path: Path) -> None:
    from pamledger.backup import take_backup

    state = tmp_path / "state"
    state.mkdir()
    (state / "admin.token").write_text("pam_admin_secret\n")
    settings = env.settings.model_copy(update={"state_dir": state})
    left_out = await take_backup(settings, env.database_url, tmp_path / "plain")
    assert left_out["secrets"]["included"] is False and "admin.token" in left_out["secrets"]["note"]
    assert b"pam_admin_secret" not in b"".join(p.read_bytes() for p in (tmp_path / "plain").rglob("*") if p.is_file())
    asked = await take_backup(settings, env.database_url, tmp_path / "asked", include_secrets=True)
    assert asked["secrets"]["files"] == ["secrets/admin.token"]
    copied = tmp_path / "asked" / "secrets" / "admin.token"
    assert copied.read_text() == "pam_admin_secret\n" and copied.stat().st_mode & 0o077 == 0
    with pytest.raises(PamledgerError) as refused:  # never over an existing backup
        await take_backup(settings, env.database_url, tmp_path / "asked")
    assert refused.value.code == "invalid_request"


def test_a_backup_of_a_newer_schema_is_refused(env: Env, world: World, tmp_path: Path) -> None:
    newer = tmp_path / "newer"
    shutil.copytree(world.backup, newer)
    manifest = json.loads((newer / "manifest.json").read_text())
    (newer / "manifest.json").write_text(json.dumps({**manifest, "schema_version": 999}))
    code, error = cli_json(env, "restore", str(newer), "--replace", "--quiet")
    assert code != 0 and error["error"]["details"]["rule"] == "restore.schema_too_new"


def test_a_manifest_naming_another_file_as_its_dump_is_refused(env: Env, world: World, tmp_path: Path) -> None:
    """The checksum is of the dump restore reads, never of a file a forged manifest names instead."""
    forged = tmp_path / "forged"
    shutil.copytree(world.backup, forged)
    (forged / "other.bin").write_bytes(b"anything")
    manifest = json.loads((forged / "manifest.json").read_text())
    manifest["database"]["file"] = "other.bin"
    (forged / "manifest.json").write_text(json.dumps(manifest))
    code, error = cli_json(env, "restore", str(forged), "--replace", "--quiet")
    assert code != 0 and "other.bin" in error["error"]["message"]
