"""One progress style (pamledger_client.progress): JSON lines off a terminal, a bar with rate and ETA on one,
nothing when quiet."""

from __future__ import annotations

import io
import json

from pamledger_client.progress import ProgressReporter


def test_off_a_terminal_each_update_is_one_json_line() -> None:
    out = io.StringIO()
    report = ProgressReporter("export", "ledger_sequence", "watermark", stream=out, tty=False)
    report({"ledger_sequence": 5, "watermark": 10})
    report.note("waiting")
    report.finish()
    assert [json.loads(line) for line in out.getvalue().splitlines()] == [
        {"progress": {"ledger_sequence": 5, "watermark": 10}}, {"progress": {"note": "waiting"}}]


def test_on_a_terminal_a_bar_with_rate_and_eta() -> None:
    report = ProgressReporter("verify", "rows_checked", "head", stream=io.StringIO(), tty=True, unit="rows")
    report.render({"rows_checked": 0, "head": 1000}, now=100.0)
    line = report.render({"rows_checked": 250, "head": 1000}, now=101.0)
    assert line.startswith("verify [#######.....................]  25% 250/1,000 rows 250/s ETA 0:03"), line


def test_without_a_total_the_fields_are_shown() -> None:
    report = ProgressReporter("scrub", stream=io.StringIO(), tty=True)
    assert report.render({"phase": "vacuum", "table": "content_store"}, now=report.started + 3).startswith(
        "scrub: phase=vacuum table=content_store (0:03)")


def test_quiet_prints_nothing() -> None:
    out = io.StringIO()
    report = ProgressReporter("import", "imported_entries", "of", quiet=True, stream=out, tty=True)
    report({"imported_entries": 1, "of": 2})
    report.note("x")
    report.finish()
    assert out.getvalue() == ""
