"""The erasure journal: every erasure the ledger commits, recorded outside the database (PAMSPEC 17.1).

Why: a restore puts back the database as it was when the backup was taken, content erased since included.
The ledger cannot say what was erased after its own backup, so the writer keeps a second record, a JSON
Lines file (by default `<state_dir>/erasure-journal.jsonl`, settable to another disk), which `pamledger
restore` reads to erase again what was erased after the backup's head (pamledger/restore.py).

Content-free: a line names the erasing entry (ledger id, partition, sequence, event id and type), its object,
the version it erased from, and a partial redaction's JSON Pointers; never content, digests or salts.

Three kinds of line, read in file order:
- `erasure`: one erasing ledger entry (a deletion, an erasing redaction, an availability transition to
  redacted or deleted), written and fsynced by the writer after COMMIT and before it replies, so an erasure a
  client saw acknowledged is in the journal;
- `checkpoint`: "every erasure of this ledger up to `through` is above": written when a writer starts, after
  it has journaled what the ledger holds past the previous checkpoint (a writer that died between COMMIT and
  its journal write left that gap; the first checkpoint of a ledger is written after a scan from its start);
- `restored`: a restore put the ledger back to `backup_head` and erased again; `through` is the head after it.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import msgspec
import structlog

from command_handler.core.imports import erases
from infra.ledger import LedgerRow
from infra.settings import Settings
from schemas.canonical import canonical_bytes
from schemas.common import timestamp_text
from schemas.events import Transitioned, decode_event

log = structlog.get_logger(__name__)

JOURNAL_NAME = "erasure-journal.jsonl"
ERASING_EVENT_TYPES = ("object_deleted", "object_redacted", "availability_transitioned")


class Erasure(msgspec.Struct, tag_field="kind", tag="erasure", frozen=True, kw_only=True, omit_defaults=True):
    """One erasing ledger entry, as the journal keeps it (no content)."""

    ledger_id: str
    partition: int
    ledger_sequence: int
    event_id: str
    event_type: str
    scope_id: str
    object_id: str
    version_id: str
    previous_version_id: str
    to: str  # the availability state the entry left the object in
    pointers: list[str] | None = None  # a partial redaction's JSON Pointers
    operation_id: str | None = None  # `restore:<event id>` where a restore made it again (pamledger.restore)


class Checkpoint(msgspec.Struct, tag_field="kind", tag="checkpoint", frozen=True, kw_only=True):
    ledger_id: str
    partition: int
    through: int
    at: str


class Restored(msgspec.Struct, tag_field="kind", tag="restored", frozen=True, kw_only=True):
    ledger_id: str
    partition: int
    backup_head: int
    through: int
    at: str
    reapplied: int


Line = Erasure | Checkpoint | Restored
_decode_line = msgspec.json.Decoder(Erasure | Checkpoint | Restored).decode


class Coverage(msgspec.Struct, kw_only=True):
    """What the journal holds for one ledger partition: its erasures (file order) and how far it vouches."""

    erasures: list[Erasure] = msgspec.field(default_factory=list)
    through: int | None = None  # None: no checkpoint, the journal does not vouch for this ledger at all
    restores: int = 0


def erasures_in(rows: Iterable[LedgerRow], ledger_id: str, partition: int) -> list[Erasure]:
    """The journal lines of the erasing entries among committed ledger rows (pure)."""
    found = []
    for row in rows:
        if row.event_type not in ERASING_EVENT_TYPES:
            continue
        event = decode_event(row.event)
        if not erases(event) or not isinstance(event.payload, Transitioned):
            continue
        redaction = event.payload.redaction or {}
        found.append(Erasure(
            ledger_id=ledger_id, partition=partition, ledger_sequence=row.ledger_sequence,
            event_id=event.event_id, event_type=event.event_type, scope_id=event.scope_id,
            object_id=event.object_id or event.relationship_id or "", version_id=event.version_id,
            previous_version_id=event.payload.previous_version_id, to=event.payload.to,
            pointers=redaction.get("pointers"), operation_id=row.operation_id))
    return found


def now_text() -> str:
    return timestamp_text(datetime.now(timezone.utc))


class ErasureJournal:
    """The journal file: appended with fsync, read whole (erasures are few next to the ledger's entries)."""

    def __init__(self, path: Path):
        self.path = path

    def append(self, lines: list[Line]) -> None:
        """Write the lines and fsync before returning (the file is created 0600, its folder if missing)."""
        if not lines:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        data = b"".join(canonical_bytes(line) + b"\n" for line in lines)
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        try:
            os.write(fd, data)
            os.fsync(fd)
        finally:
            os.close(fd)

    def exists(self) -> bool:
        return self.path.is_file()

    def lines(self) -> Iterator[tuple[int, Line | None]]:
        """(line number, line) in file order; a line that does not decode (a torn last write) is None."""
        with self.path.open("rb") as handle:
            for number, raw in enumerate(handle, start=1):
                if not raw.strip():
                    continue
                try:
                    yield number, _decode_line(raw)
                except msgspec.ValidationError:
                    yield number, None
                except msgspec.DecodeError:
                    yield number, None

    def coverage(self, ledger_id: str, partition: int) -> Coverage:
        """What the journal holds for this ledger partition (empty when the file is absent)."""
        found = Coverage()
        if not self.exists():
            return found
        for number, line in self.lines():
            if line is None:
                log.warning("erasure_journal.line_unreadable", path=str(self.path), line=number)
                continue
            if line.ledger_id != ledger_id or line.partition != partition:
                continue
            if isinstance(line, Erasure):
                found.erasures.append(line)
            else:
                found.through = line.through
                found.restores += isinstance(line, Restored)
        return found


def journal_for(settings: Settings) -> ErasureJournal:
    """The journal the settings name (writer.erasure_journal, else the state dir's)."""
    return ErasureJournal(settings.writer.erasure_journal or settings.state_dir / JOURNAL_NAME)


async def catch_up(journal: ErasureJournal, store: Any, ledger_id: str, partition: int, head: int) -> int:
    """Journal the ledger's erasing entries after the journal's last checkpoint that it lacks, then write a
    checkpoint at `head`; returns how many were missing. Run by the writer before it serves, with its store
    (on the connection holding the lock), so no entry can commit meanwhile."""
    coverage = journal.coverage(ledger_id, partition)
    start = coverage.through or 0
    if head < start:  # the database went back (restored by hand?): the erasures past its head are not in it
        behind = [e for e in coverage.erasures if e.ledger_sequence > head]
        log.error("erasure_journal.ledger_behind", ledger_head=head, journal_through=start,
                  erasures_after_head=len(behind),
                  hint="the database is older than the erasure journal: run `pamledger restore --erasures-only`"
                       " so content erased since does not stay back")
        return 0  # no checkpoint: the journal keeps saying what the ledger lacks
    known = {e.event_id for e in coverage.erasures if e.ledger_sequence > start}
    rows = await store.erasing_rows(start, ERASING_EVENT_TYPES)  # command_handler.store_reads
    missing: list[Line] = [e for e in erasures_in(rows, ledger_id, partition) if e.event_id not in known]
    journal.append([*missing, Checkpoint(ledger_id=ledger_id, partition=partition, through=head, at=now_text())])
    if missing:
        log.warning("erasure_journal.caught_up", missing=len(missing), after=start, through=head)
    return len(missing)
