"""The erasure journal (command_handler.erasure_journal): every erasure the writer commits is recorded outside
the database, content-free, before the reply; an erasure missing from it (a writer that died between COMMIT
and its journal write) is made up for when a writer starts."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from command_handler.erasure_journal import journal_for
from infra.settings import WriterSettings
from tests.conftest import ACTOR, PROVENANCE, Env, Servers, fresh_database, fresh_settings, serving
from tests.integration.test_erasure_canary import word

SCOPE = "workspace:journal"


def lines(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


async def test_an_erasure_is_journaled_without_content_and_a_lost_line_comes_back(env: Env) -> None:
    journal = journal_for(env.settings).path
    secret = word("secret")
    async with serving(env) as client:
        await client.create_scope(SCOPE)
        made = await client.create(SCOPE, "claim", {"statement": f"erase me {secret}"}, ACTOR, PROVENANCE)
        gone = await client.delete(SCOPE, made["object_id"], made["version_id"], ACTOR, PROVENANCE)
        kept = await client.create(SCOPE, "claim", {"statement": "kept"}, ACTOR, PROVENANCE)
        await client.redact(SCOPE, kept["object_id"], kept["version_id"], ACTOR, PROVENANCE, "gdpr:art17",
                            pointers=["/statement"])
        # Written before the reply: the file holds both once the commands are answered.
        erasures = [line for line in lines(journal) if line["kind"] == "erasure"]
    assert [(e["object_id"], e["event_type"], e["to"]) for e in erasures] == [
        (made["object_id"], "object_deleted", "deleted"), (kept["object_id"], "object_redacted", "partially_redacted")]
    assert erasures[0]["ledger_sequence"] == gone["ledger_sequence"] and erasures[1]["pointers"] == ["/statement"]
    assert secret not in journal.read_text() and "erase me" not in journal.read_text()
    checkpoints = [line for line in lines(journal) if line["kind"] == "checkpoint"]
    assert checkpoints and checkpoints[0]["through"] == 0  # the first start vouches from the ledger's start

    # The writer died after COMMIT, before its journal write: the deletion's line is missing.
    kept_lines = [line for line in journal.read_text().splitlines() if made["object_id"] not in line]
    journal.write_text("\n".join(kept_lines) + "\n")
    async with serving(env):
        pass
    after = lines(journal)
    again = [line for line in after if line["kind"] == "erasure" and line["object_id"] == made["object_id"]]
    assert len(again) == 1 and again[0]["event_id"] == erasures[0]["event_id"]
    assert after[-1]["kind"] == "checkpoint" and after[-1]["through"] >= gone["ledger_sequence"]
    # Another start adds only a checkpoint: nothing is journaled twice.
    async with serving(env):
        pass
    assert [line for line in lines(journal) if line["kind"] == "erasure"] == [
        line for line in after if line["kind"] == "erasure"]


@pytest.mark.parametrize("bad", [b"{not json\n", b'{"kind": "erasure"}\n'])
async def test_an_unreadable_line_is_skipped_and_logged_not_fatal(env: Env, bad: bytes) -> None:
    journal = journal_for(env.settings)
    with journal.path.open("ab") as handle:
        handle.write(bad)
    async with serving(env) as client:
        assert (await client.status("writer"))["role"] == "leader"


async def test_a_journal_that_cannot_be_written_costs_no_reply(servers: Servers, tmp_path: Path) -> None:
    """The journal's path is a folder: the erasure commits and is answered, the writer serves on, and the
    failure is logged (the next start makes it up from the ledger)."""
    blocked = tmp_path / "journal-is-a-folder"
    blocked.mkdir()
    env = Env(servers, fresh_database(servers, "journal_blocked"),
              fresh_settings("journal_blocked", writer=WriterSettings(erasure_journal=blocked)))
    async with serving(env) as client:
        await client.create_scope(SCOPE)
        made = await client.create(SCOPE, "claim", {"statement": "x"}, ACTOR, PROVENANCE)
        gone = await client.delete(SCOPE, made["object_id"], made["version_id"], ACTOR, PROVENANCE)
        assert gone["version_id"] != made["version_id"]
        after = await client.create(SCOPE, "claim", {"statement": "still serving"}, ACTOR, PROVENANCE)
        assert after["ledger_sequence"] > gone["ledger_sequence"]
