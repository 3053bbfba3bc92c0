"""The erasure journal's file rules (command_handler.erasure_journal): coverage per ledger, restored lines, and a
database found behind the journal (restored by other means), which must not be checkpointed over."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from command_handler.erasure_journal import Checkpoint, Erasure, ErasureJournal, Restored, catch_up

LEDGER = "ledger:one"


def erasure(seq: int, event: str, ledger: str = LEDGER) -> Erasure:
    return Erasure(ledger_id=ledger, partition=0, ledger_sequence=seq, event_id=event, event_type="object_deleted",
                   scope_id="workspace:a", object_id=f"mem:{event}", version_id=f"ver:{event}",
                   previous_version_id="ver:prev", to="deleted")


class NoRows:
    """The writer's read port with nothing erased in the ledger past the journal."""

    async def erasing_rows(self, after: int, event_types: tuple[str, ...]) -> list[Any]:
        return []


def test_coverage_is_per_ledger_and_the_last_checkpoint_or_restore_counts(tmp_path: Path) -> None:
    journal = ErasureJournal(tmp_path / "j.jsonl")
    assert journal.coverage(LEDGER, 0).through is None  # absent: vouches for nothing
    journal.append([Checkpoint(ledger_id=LEDGER, partition=0, through=0, at="t"), erasure(5, "e5"),
                    erasure(6, "x6", ledger="ledger:other"), Checkpoint(ledger_id=LEDGER, partition=0, through=9, at="t"),
                    Restored(ledger_id=LEDGER, partition=0, backup_head=3, through=3, at="t", reapplied=1)])
    coverage = journal.coverage(LEDGER, 0)
    assert [e.event_id for e in coverage.erasures] == ["e5"] and coverage.through == 3 and coverage.restores == 1
    assert journal.coverage("ledger:other", 0).through is None
    assert journal.coverage(LEDGER, 1).erasures == []


async def test_a_database_behind_the_journal_is_not_checkpointed_over(tmp_path: Path) -> None:
    journal = ErasureJournal(tmp_path / "j.jsonl")
    journal.append([Checkpoint(ledger_id=LEDGER, partition=0, through=20, at="t"), erasure(15, "e15")])
    before = journal.path.read_bytes()
    assert await catch_up(journal, NoRows(), LEDGER, 0, head=10) == 0
    assert journal.path.read_bytes() == before  # still says what the ledger lacks, for `restore --erasures-only`
    assert await catch_up(journal, NoRows(), LEDGER, 0, head=25) == 0
    assert journal.coverage(LEDGER, 0).through == 25


def test_a_torn_last_line_is_skipped(tmp_path: Path) -> None:
    journal = ErasureJournal(tmp_path / "j.jsonl")
    journal.append([erasure(1, "e1")])
    with journal.path.open("ab") as handle:
        handle.write(b'{"kind":"erasure","ledger_id":"ledger:one","part')
    assert [e.event_id for e in journal.coverage(LEDGER, 0).erasures] == ["e1"]
