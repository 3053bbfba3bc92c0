"""`pamledger restore DIR`: put a backup back, then erase again what was erased after it (PAMSPEC 17.1).

In order, refusing before anything changes where a step cannot hold:
1. the backup: its manifest and its dump's sha256;
2. the erasure journal (command_handler.erasure_journal): it must vouch for the backup's ledger (a
   checkpoint of it); absent or foreign, the restore refuses unless --accept-unverified-erasures, and the
   result then says the erasures after the backup could not be checked;
3. the target: no role may hold its leadership lock on the database (stop the service first); a database
   holding a ledger is replaced only with --replace;
4. the database is dropped, re-created and pg_restore'd; migrations bring an older schema forward; the head
   must be the manifest's (sequence and hash);
5. the JetStream stream is rebuilt from the restored ledger (the old one holds entries the ledger lost);
6. every journaled erasure whose entry is not in the restored ledger is done again through the writer, by the
   caller (the administrator where auth is enforced), each under the idempotency key `restore:<event id>`;
   the projector and the indexer run until they have applied it, so no table, stream or vector keeps
   what was erased. `pamledger restore --erasures-only` does this step alone, for a database put back by
   other means (the writer logs `erasure_journal.ledger_behind` when it finds one).

Re-applying, per journaled erasure (its object as the restored ledger has it):
- object absent (made after the backup): nothing to erase; already deleted: nothing left;
- a deletion, or an erasing transition to deleted: delete;
- a full redaction or a transition to redacted: an erasing redaction; an object the backup holds
  redacted without erasure (suppressed) cannot be redacted again, so it is deleted;
- a partial redaction: the same JSON Pointers where the object is at the version the redaction was made
  on; otherwise a full erasing redaction, because the original erased the content of every version up to
  it (the restored versions included) and kept only a projection of a version the backup does not have.
Restoring again from a backup older than an earlier restore's re-applied erasures can therefore erase more
than a partial redaction did, never less.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import psycopg
from psycopg import sql

from command_handler.erasure_journal import Erasure, ErasureJournal, Restored, journal_for, now_text
from embedding.store import INDEX_CHECKPOINT
from infra import locks
from infra.ledger import known_event_ids, ledger_head, ledger_tail
from infra.ledger_identity import ledger_identity
from infra.migrations import migrate, migration_files
from infra.partitions import recorded_count_async
from infra.projections import PROJECTION, checkpoint, partition_checkpoint
from infra.settings import Settings
from local_servers.pg_tools import pg_tool
from pamledger_client.client import MemoryClient
from pamledger_client.errors import PamspecError
from pamledger.backup import DUMP, Manifest, file_sha256, read_manifest
from schemas.errors import InvalidRequest, PamledgerError, ServiceUnavailable

Progress = Callable[[dict[str, Any]], None]
RESTORE_ACTOR = {"actor_id": "actor:pamledger:restore", "actor_kind": "service"}
ROLES = ("writer", "query", "projector", "indexer")  # what an erasure needs to reach every store
ABSENT = frozenset({"object_not_found", "scope_not_found"})
REAPPLIED = "restore:"  # the operation id and idempotency key of an erasure made again: restore:<event id>


async def restore(settings: Settings, nats_url: str, database_url: str, folder: Path, replace: bool = False,
                  accept_unverified: bool = False, progress: Progress = lambda _: None) -> dict[str, Any]:
    manifest = read_manifest(folder)
    if not (folder / DUMP).is_file() or file_sha256(folder / DUMP) != manifest.database.sha256:
        raise InvalidRequest(f"{folder / DUMP} is missing or does not match the manifest's sha256: the backup"
                             " is damaged or was edited", details={"backup": str(folder)})
    newest = migration_files()[-1][0]
    if manifest.schema_version > newest:
        raise InvalidRequest(f"the backup's schema is version {manifest.schema_version}, newer than this pamledger"
                             f" knows ({newest}): restore it with pamledger {manifest.pamledger_version} or later",
                             details={"rule": "restore.schema_too_new", "backup_schema": manifest.schema_version})
    _refuse_another_count(settings, len(manifest.marks()), "the backup's ledger")
    journal = journal_for(settings)
    vouched = _journal_vouches(journal, manifest, accept_unverified)
    partitions = range(settings.partitions)
    await _refuse_if_serving(database_url, partitions)
    await _refuse_if_occupied(database_url, partitions, replace)
    progress({"step": "restore_database", "bytes": manifest.database.bytes})
    await _replace_database(database_url, folder / DUMP)
    migrate(database_url)
    await _check_heads(database_url, manifest)
    progress({"step": "rebuild_stream"})
    stream = await _rebuild_streams(settings, nats_url, database_url)
    outcome = await reapply_erasures(settings, nats_url, database_url, journal, progress)
    several = {"partitions": {str(m.partition): {"ledger_id": m.ledger_id, "backup_head": m.head_sequence}
                              for m in manifest.marks()}} if len(manifest.marks()) > 1 else {}
    return {"restored": str(folder), "ledger_id": manifest.ledger.ledger_id,
            "backup_head": manifest.ledger.head_sequence, "taken_at": manifest.taken_at, **several,
            "stream": stream, "erasures": {**outcome, "journal": str(journal.path), "verified": vouched}}


def _refuse_another_count(settings: Settings, count: int, whose: str) -> None:
    """The service restore runs (and the one started after it) refuses a ledger of another partition count."""
    if count != settings.partitions:
        raise InvalidRequest(f"{whose} has {count} partition(s), the settings ask for partitions={settings.partitions}:"
                             f" set PAMLEDGER_PARTITIONS={count} (a ledger keeps its partition count)",
                             details={"rule": "restore.partitions_differ", "ledger_partitions": count,
                                      "settings_partitions": settings.partitions})


async def _rebuild_streams(settings: Settings, nats_url: str, database_url: str) -> dict[str, Any]:
    """Every partition's stream made anew from the restored ledger (the old ones hold entries it lost, hence
    forced): `{republished_through, discarded}`, partition 0's, and with several partitions each one's."""
    from pamledger.cli_ledger import rebuild_stream, rebuild_streams

    def summary(stream: dict[str, Any]) -> dict[str, Any]:
        return {"republished_through": stream["republished_through"],
                "discarded": len((stream.get("previous") or {}).get("discarded") or [])}

    if settings.partitions == 1:
        return summary(await rebuild_stream(settings, nats_url, database_url, force=True))
    each = await rebuild_streams(settings, nats_url, database_url, list(range(settings.partitions)), force=True)
    return {**summary(each[0]), "partitions": {str(p): summary(r) for p, r in each.items()}}


def _journal_vouches(journal: ErasureJournal, manifest: Manifest, accept_unverified: bool) -> bool:
    """Whether the journal speaks for the backup's ledger; refuses where it does not, unless accepted."""
    # A partition without entries: nothing of it can have been erased before the backup.
    unvouched = [m for m in manifest.marks() if m.ledger_id is not None
                 and journal.coverage(m.ledger_id, m.partition).through is None]
    if not unvouched:
        return True
    ledger_id = unvouched[0].ledger_id
    why = (f"the erasure journal {journal.path} does not exist" if not journal.exists()
           else f"the erasure journal {journal.path} has no record of ledger {ledger_id}"
                + (f" (partition {unvouched[0].partition})" if len(manifest.marks()) > 1 else ""))
    if accept_unverified:
        return False
    raise InvalidRequest(
        f"{why}: content erased after this backup was taken could come back and nothing could tell. Point"
        " PAMLEDGER_WRITER__ERASURE_JOURNAL at the journal the service kept, or pass"
        " --accept-unverified-erasures to restore anyway",
        details={"rule": "restore.erasures_unverified", "journal": str(journal.path), "ledger_id": ledger_id})


async def _refuse_if_serving(database_url: str, partitions: range) -> None:
    """A role leading on this database holds its advisory lock (in any partition): the service must be
    stopped first."""
    async with await psycopg.AsyncConnection.connect(database_url, autocommit=True) as conn:
        for (role, base), partition in ((r, p) for r in locks.PARTITIONED_BASES.items() for p in partitions):
            key = locks.partition_key(base, partition)
            row = await (await conn.execute("SELECT pg_try_advisory_lock(%s)", (key,))).fetchone()
            if not (row and row[0]):
                raise InvalidRequest(f"the service is running on this database (its {role} leads): stop it"
                                     " before restoring", details={"rule": "restore.service_running", "role": role})
            await conn.execute("SELECT pg_advisory_unlock(%s)", (key,))


async def _refuse_if_occupied(database_url: str, partitions: range, replace: bool) -> None:
    async with await psycopg.AsyncConnection.connect(database_url, autocommit=True) as conn:
        for partition in partitions:
            try:
                head, _ = await ledger_tail(conn, partition)
            except psycopg.errors.UndefinedTable:
                return  # a database never migrated: nothing to lose
            if head and not replace:
                await _refuse_occupied(conn, partition, head)


async def _refuse_occupied(conn: psycopg.AsyncConnection[Any], partition: int, head: int) -> None:
    ledger_id = await ledger_identity(conn, partition)
    raise InvalidRequest(f"the database holds ledger {ledger_id} (head {head}): restoring replaces it"
                         " with the backup's; pass --replace to do so",
                         details={"rule": "restore.database_not_empty", "ledger_id": ledger_id, "ledger_head": head,
                                  "partition": partition})


async def _replace_database(database_url: str, dump: Path) -> None:
    """Empty the database (every schema of its own dropped, `public` made anew: the local servers keep the
    ledger in the `postgres` database, which cannot be dropped while connected), then pg_restore the dump."""
    async with await psycopg.AsyncConnection.connect(database_url, autocommit=True) as conn:
        cur = await conn.execute("SELECT nspname FROM pg_namespace WHERE nspname NOT LIKE 'pg\\_%%'"
                                 " AND nspname <> 'information_schema'")
        schemas = [str(row[0]) for row in await cur.fetchall()]
        async with conn.transaction():
            for schema in schemas:
                await conn.execute(sql.SQL("DROP SCHEMA {} CASCADE").format(sql.Identifier(schema)))
            await conn.execute("CREATE SCHEMA public")
    process = await asyncio.create_subprocess_exec(
        str(pg_tool("pg_restore")), "--no-owner", "--no-privileges", "--exit-on-error", "--single-transaction",
        f"--dbname={database_url}", str(dump), stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE)
    _, stderr = await process.communicate()
    if process.returncode != 0:
        raise PamledgerError(f"pg_restore failed (exit {process.returncode}): "
                             f"{stderr.decode(errors='replace')[-2000:]}")


async def _check_heads(database_url: str, manifest: Manifest) -> None:
    """Every partition's restored head (sequence and hash) is the manifest's."""
    async with await psycopg.AsyncConnection.connect(database_url, autocommit=True) as conn:
        for mark in manifest.marks():
            sequence, row_hash = await ledger_tail(conn, mark.partition)
            found = (sequence, row_hash.hex() if row_hash is not None else None)
            if found != (mark.head_sequence, mark.head_hash):
                raise PamledgerError("the restored ledger's head is not the manifest's", details={
                    "partition": mark.partition, "restored": {"sequence": found[0], "hash": found[1]},
                    "manifest": {"sequence": mark.head_sequence, "hash": mark.head_hash}})


async def pending_erasures(journal: ErasureJournal, database_url: str, partition: int) -> tuple[str, int, list[Erasure]]:
    """(ledger id, head, the journal's erasures of this ledger whose entries the ledger does not hold), in the
    order they were made."""
    async with await psycopg.AsyncConnection.connect(database_url, autocommit=True) as conn:
        ledger_id = await ledger_identity(conn, partition)
        head = await ledger_head(conn, partition)
        erasures = journal.coverage(ledger_id, partition).erasures
        present = await known_event_ids(conn, partition, [e.event_id for e in erasures])
    journaled = {e.event_id for e in erasures}
    seen: set[str] = set()
    pending = []
    for erasure in erasures:
        if erasure.event_id in present or erasure.event_id in seen:
            continue
        seen.add(erasure.event_id)
        if _again_of(erasure) in journaled:
            continue  # an earlier restore's re-application of a journaled erasure: that erasure governs
        pending.append(erasure)
    return ledger_id, head, pending


def _again_of(erasure: Erasure) -> str | None:
    """The event id an erasure made by a restore re-applied (its operation id says), else None."""
    operation = erasure.operation_id or ""
    return operation.removeprefix(REAPPLIED) if operation.startswith(REAPPLIED) else None


async def reapply_erasures(settings: Settings, nats_url: str, database_url: str, journal: ErasureJournal,
                           progress: Progress = lambda _: None) -> dict[str, Any]:
    """Do again, through the writer, every journaled erasure the ledger lacks; run the followers until they
    applied them. Returns counts by outcome and the refusals (an erasure that could not be done again)."""
    partitions = await _partitions_of(settings, database_url)
    pending: list[Erasure] = []
    restored: list[Restored] = []
    for partition in partitions:  # each partition's ledger id, head and erasures are its own
        ledger_id, head, missing = await pending_erasures(journal, database_url, partition)
        pending.extend(missing)
        restored.append(Restored(ledger_id=ledger_id, partition=partition, backup_head=head, through=head,
                                 at=now_text(), reapplied=len(missing)))
    # Recorded first: each partition's writer then finds the journal in step with the restored head.
    journal.append(list(restored))
    outcomes: dict[str, int] = {}
    refused: list[dict[str, Any]] = []
    if pending:
        async with _service(settings, nats_url, database_url) as client:
            actor = await client.me(RESTORE_ACTOR)
            versions: dict[str, str] = {}  # original version id -> the version its re-application made
            for number, erasure in enumerate(pending, start=1):
                outcome = await _reapply(client, actor, erasure, versions)
                outcomes[outcome["outcome"]] = outcomes.get(outcome["outcome"], 0) + 1
                if outcome["outcome"] == "refused":
                    refused.append(outcome)
                progress({"step": "reapply_erasures", "done": number, "of": len(pending)})
            for partition in partitions:
                await _followers_caught_up(database_url, partition)
    return {"pending": len(pending), "outcomes": outcomes, "refused": refused}


async def _reapply(client: MemoryClient, actor: dict[str, Any], erasure: Erasure,
                   versions: dict[str, str]) -> dict[str, Any]:
    where = {"scope_id": erasure.scope_id, "object_id": erasure.object_id, "event_id": erasure.event_id}
    try:  # history, not read: it answers for redacted objects and relationships alike
        versions_found = (await client.history(erasure.scope_id, erasure.object_id))["versions"]
    except PamspecError as exc:
        if exc.code in ABSENT:
            return {**where, "outcome": "absent"}
        return {**where, "outcome": "refused", "code": exc.code, "message": exc.message}
    head, availability = versions_found[-1]["version_id"], versions_found[-1].get("availability_state")
    if availability == "deleted":
        return {**where, "outcome": "already_erased"}
    provenance = {"provenance_id": "prov:pamledger:restore", "actor": actor,
                  "activity": f"restore: erased again after a restore ({erasure.event_id}, ledger sequence"
                              f" {erasure.ledger_sequence} of {erasure.ledger_id})"}
    basis = f"erasure {erasure.event_id} was committed after the backup this ledger was restored from"
    key = f"{REAPPLIED}{erasure.event_id}"
    try:
        if erasure.to == "deleted" or availability == "redacted":
            result = await client.delete(erasure.scope_id, erasure.object_id, head, actor, provenance,
                                         idempotency_key=key, operation_id=key)
            done = "deleted"
        elif erasure.to == "partially_redacted" and erasure.pointers and head == versions.get(
                erasure.previous_version_id, erasure.previous_version_id):
            result = await client.redact(erasure.scope_id, erasure.object_id, head, actor, provenance, basis,
                                         pointers=erasure.pointers, idempotency_key=key, operation_id=key)
            done = "partially_redacted"
        else:
            result = await client.redact(erasure.scope_id, erasure.object_id, head, actor, provenance, basis,
                                         idempotency_key=key, operation_id=key)
            done = "redacted"
    except PamspecError as exc:
        return {**where, "outcome": "refused", "code": exc.code, "message": exc.message}
    versions[erasure.version_id] = str(result.get("version_id"))
    return {**where, "outcome": done}


@contextlib.asynccontextmanager
async def _service(settings: Settings, nats_url: str, database_url: str) -> AsyncIterator[MemoryClient]:
    """The roles an erasure needs, in this process, and a client of them (the caller's token)."""
    from pamledger.cli_dispatch import client_config
    from pamledger_client.connection import open_nats
    from pamledger.nats_users import operator_nats_options
    from pamledger.runtime import run_service

    stop = asyncio.Event()
    task = asyncio.create_task(run_service(settings, nats_url, database_url, stop, roles=ROLES))
    nc = await open_nats(nats_url, 5.0, login=operator_nats_options(settings))
    client = MemoryClient(nc, settings.subject_prefix, settings.request_timeout_seconds, token=client_config(settings).find_token())
    client._owns = True
    try:
        await _until(lambda: _answers(client), 120.0, "the writer, query, projector and indexer to answer")
        yield client
    finally:
        await client.close()
        stop.set()
        await task


async def _answers(client: MemoryClient) -> bool:
    try:
        for role in ROLES:
            await client.status(role)
    except PamspecError:
        return False
    return True


async def _partitions_of(settings: Settings, database_url: str) -> range:
    """The ledger's partitions (its recorded count, which the settings must name: the service refuses another)."""
    async with await psycopg.AsyncConnection.connect(database_url, autocommit=True) as conn:
        count = await recorded_count_async(conn) or settings.partitions
    _refuse_another_count(settings, count, "the database's ledger")
    return range(count)


async def _followers_caught_up(database_url: str, partition: int) -> None:
    """Wait until the partition's projector and indexer have applied its ledger up to its head (they erase
    there)."""
    async def caught_up() -> bool:
        async with await psycopg.AsyncConnection.connect(database_url, autocommit=True) as conn:
            head = await ledger_head(conn, partition)
            return min(await checkpoint(conn, partition_checkpoint(PROJECTION, partition)),
                       await checkpoint(conn, partition_checkpoint(INDEX_CHECKPOINT, partition))) >= head
    await _until(caught_up, 300.0, "the projector and the indexer to apply the re-applied erasures")


async def _until(predicate: Callable[[], Any], timeout: float, what: str) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not await predicate():
        if loop.time() > deadline:
            raise ServiceUnavailable(f"restore waited {timeout:.0f} s for {what}")
        await asyncio.sleep(0.2)
