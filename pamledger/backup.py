"""`pamledger backup --out DIR`: one consistent online snapshot of the database, with a manifest.

Consistent: a REPEATABLE READ transaction exports its snapshot, reads every partition's ledger head and hash
in it, and pg_dump dumps that very snapshot (`--snapshot`), so the manifest's heads are the dump's heads
exactly, while the service goes on writing. The backup is made in `DIR.partial` and renamed when complete: a backup folder
is whole or absent.

Secrets: the database holds token digests and NATS password hashes only (no token can be recovered from
them). The secrets are files of the state dir (admin.token, service.token, the NATS service password); they
are copied into the backup only with `--include-secrets` (folder `secrets/`, mode 0700, files 0600), and the
manifest says which way it went.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import shutil
import time
from collections.abc import Callable
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import msgspec
import psycopg

from authz.bootstrap import admin_token_path, service_token_path
from authz.nats_auth import service_password_path
from infra.ledger import ledger_tail
from infra.ledger_identity import IDENTITY
from infra.migrations import schema_version
from infra.partitions import recorded_count_async
from infra.settings import Settings
from local_servers.pg_tools import pg_tool, tool_version
from pamledger_client.cli_common import installed_version
from schemas.canonical import canonical_bytes
from schemas.common import timestamp_text
from schemas.errors import InvalidRequest, PamledgerError

FORMAT = "pamledger-backup"
# 2: `partitions` holds every partition's mark (infra.partitions); 1 (still read): `ledger` alone, one partition.
FORMAT_VERSION = 2
READABLE_VERSIONS = (1, 2)
MANIFEST = "manifest.json"
DUMP = "database.dump"
Progress = Callable[[dict[str, Any]], None]


class LedgerMark(msgspec.Struct, frozen=True, kw_only=True):
    """Where one ledger partition stood in the snapshot."""

    partition: int
    ledger_id: str | None  # None: the partition has no entry yet
    head_sequence: int
    head_hash: str | None  # hex of the head row's row_hash


class DumpFile(msgspec.Struct, frozen=True, kw_only=True):
    file: str
    bytes: int
    sha256: str
    tool: str
    server_version: str


class SecretsNote(msgspec.Struct, frozen=True, kw_only=True):
    included: bool
    files: list[str]
    note: str


class Manifest(msgspec.Struct, frozen=True, kw_only=True):
    format: str
    format_version: int
    pamledger_version: str
    schema_version: int
    taken_at: str
    ledger: LedgerMark  # partition 0's (the whole ledger's with one partition)
    database: DumpFile
    secrets: SecretsNote
    partitions: list[LedgerMark] = []  # every partition's, in order (format 2); empty in format 1

    def marks(self) -> list[LedgerMark]:
        """Every partition's mark: format 2's list, or format 1's one mark (a ledger of one partition)."""
        return self.partitions or [self.ledger]


def read_manifest(folder: Path) -> Manifest:
    """The manifest of a backup folder; invalid_request naming what is wrong."""
    path = folder / MANIFEST
    try:
        manifest = msgspec.json.decode(path.read_bytes(), type=Manifest)
    except FileNotFoundError:
        raise InvalidRequest(f"{folder} is not a pamledger backup: it has no {MANIFEST}",
                             details={"backup": str(folder)}) from None
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        raise InvalidRequest(f"{path} is not a pamledger backup manifest: {exc}",
                             details={"backup": str(folder)}) from None
    if manifest.database.file != DUMP:  # the dump restored is always this one: a manifest naming another is forged
        raise InvalidRequest(f"{path} names the dump {manifest.database.file!r}; a pamledger backup's dump is {DUMP}",
                             details={"backup": str(folder)})
    if manifest.format != FORMAT or manifest.format_version not in READABLE_VERSIONS:
        raise InvalidRequest(f"{path} is {manifest.format} version {manifest.format_version}; this pamledger reads"
                             f" {FORMAT} versions {', '.join(map(str, READABLE_VERSIONS))}",
                             details={"backup": str(folder)})
    if manifest.partitions and [m.partition for m in manifest.partitions] != list(range(len(manifest.partitions))):
        raise InvalidRequest(f"{path} lists partitions {[m.partition for m in manifest.partitions]}; a backup lists"
                             " every partition of its ledger once, in order", details={"backup": str(folder)})
    return manifest


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        while chunk := handle.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


async def take_backup(settings: Settings, database_url: str, out: Path, include_secrets: bool = False,
                      progress: Progress = lambda _: None) -> dict[str, Any]:
    """Dump the database's snapshot into `out` (which must not exist, or be an empty folder) with its manifest."""
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise InvalidRequest(f"{out} exists and is not an empty folder: a backup never overwrites anything",
                             details={"out": str(out)})
    partial = out.with_name(out.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    partial.mkdir(parents=True, mode=0o700)
    async with await psycopg.AsyncConnection.connect(database_url) as conn:
        await conn.execute("BEGIN ISOLATION LEVEL REPEATABLE READ, READ ONLY")
        snapshot = str((await (await conn.execute("SELECT pg_export_snapshot()")).fetchone() or [""])[0])
        count = await recorded_count_async(conn) or settings.partitions  # a ledger never started: the settings'
        marks = [await _ledger_mark(conn, partition) for partition in range(count)]
        version = await schema_version(conn)
        server = str((await (await conn.execute("SHOW server_version")).fetchone() or [""])[0])
        progress({"step": "dump", "ledger_sequence": marks[0].head_sequence})
        await _pg_dump(database_url, snapshot, partial / DUMP, progress)  # while the snapshot's transaction is open
        await conn.rollback()
    dump = DumpFile(file=DUMP, bytes=(partial / DUMP).stat().st_size, sha256=file_sha256(partial / DUMP),
                    tool=tool_version("pg_dump"), server_version=server)
    manifest = Manifest(format=FORMAT, format_version=FORMAT_VERSION, pamledger_version=installed_version(),
                        schema_version=version, taken_at=timestamp_text(datetime.now(timezone.utc)), ledger=marks[0],
                        database=dump, secrets=_secrets(settings, partial, include_secrets), partitions=marks)
    _write_synced(partial / MANIFEST, canonical_bytes(manifest) + b"\n")
    if out.exists():
        out.rmdir()
    partial.rename(out)
    return {"backup": str(out), **msgspec.to_builtins(manifest)}


async def _ledger_mark(conn: psycopg.AsyncConnection[Any], partition: int) -> LedgerMark:
    row = await (await conn.execute(f"SELECT {IDENTITY}", (partition,))).fetchone()
    sequence, row_hash = await ledger_tail(conn, partition)
    return LedgerMark(partition=partition, ledger_id=row[0] if row else None, head_sequence=sequence,
                      head_hash=row_hash.hex() if row_hash is not None else None)


async def _pg_dump(database_url: str, snapshot: str, target: Path, progress: Progress) -> None:
    """pg_dump of the exported snapshot in custom format (compressed; pg_restore reads it), without planner
    statistics, with progress (bytes written) every second."""
    process = await asyncio.create_subprocess_exec(
        str(pg_tool("pg_dump")), "--format=custom", f"--snapshot={snapshot}", "--no-owner", "--no-privileges",
        "--no-statistics",  # planner statistics sample column values: content, which an erasure cannot reach there
        f"--file={target}", f"--dbname={database_url}", stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.PIPE)
    started = time.monotonic()
    waiting = asyncio.ensure_future(process.communicate())
    while not waiting.done():
        await asyncio.wait([waiting], timeout=1.0)
        if not waiting.done() and target.exists():
            progress({"step": "dump", "bytes": target.stat().st_size, "seconds": round(time.monotonic() - started, 1)})
    _, stderr = waiting.result()
    if process.returncode != 0:
        raise PamledgerError(f"pg_dump failed (exit {process.returncode}): {stderr.decode(errors='replace')[-2000:]}")
    with target.open("rb") as handle:
        os.fsync(handle.fileno())


def _secrets(settings: Settings, folder: Path, include: bool) -> SecretsNote:
    files = {"admin.token": admin_token_path(settings), "service.token": service_token_path(settings),
             "nats-service.password": service_password_path(settings.state_dir)}
    present = {name: path for name, path in files.items() if path.is_file()}
    if not include:
        return SecretsNote(included=False, files=[], note=(
            "no secret is in this backup: the database holds token digests and password hashes only;"
            f" left out: {', '.join(sorted(present)) or 'none found'} (pamledger backup --include-secrets copies them)"))
    secrets = folder / "secrets"
    secrets.mkdir(mode=0o700)
    for name, path in present.items():
        _write_synced(secrets / name, path.read_bytes())
    return SecretsNote(included=True, files=sorted(f"secrets/{name}" for name in present), note=(
        "this backup holds the state dir's tokens and the NATS service password: keep it as secret as they are"))


def _write_synced(path: Path, data: bytes) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.write(fd, data)
        os.fsync(fd)
    finally:
        os.close(fd)
