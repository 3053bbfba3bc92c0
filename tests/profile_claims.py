"""The claimed-profile gate: a session that ran tests of a profile docs/implementation-report.md claims fails
when any of them did not pass, and says which profile and which tests.

Why: PAMSPEC 18 forbids claiming a profile unless every mandatory requirement is met, and the report is where
pamledger claims them. Test modules name the profiles they prove with `@pytest.mark.profile("PAMSPEC-Core")`
(module level: `pytestmark`); this plugin (loaded by tests/conftest.py) reads the report's claims table,
records the outcome of every marked test, and at the end of the session turns a failure, an error or an xfail
of a claimed profile's test into a failed session (exit 1) with a "PAMSPEC profiles" summary naming them.
Skips are listed with their reasons but do not fail (the official PAMSPEC files may be absent; a few vectors
are out of scope, each with its reason). tests/unit/test_implementation_report.py holds the report and the
markers to each other. PAMLEDGER_PROFILE_REPORT names another report (the gate's own test uses one).
"""

from __future__ import annotations

import os
import re
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

import pytest

MARKER = "profile"
REPORT = Path(__file__).resolve().parents[1] / "docs" / "implementation-report.md"
_ROW = re.compile(r"^\|\s*(PAMSPEC-[A-Za-z-]+)\s*\|([^|]*)\|([^|]*)\|(.*)\|\s*$")
STATUSES = ("yes", "pending", "no")
SHOWN_SKIPS = 10  # skipped tests listed in the summary (once, whatever profiles they prove)


@dataclass(frozen=True)
class Claim:
    profile: str
    version: str
    status: str  # yes | pending | no
    proved_by: str  # the table's last cell, as written


def report_path() -> Path:
    return Path(os.environ.get("PAMLEDGER_PROFILE_REPORT") or REPORT)


def read_claims(path: Path) -> dict[str, Claim]:
    """The claims table: every row whose first cell is a PAMSPEC profile name. A status other than yes /
    pending / no is a ValueError (a claim must be readable to be checked)."""
    claims: dict[str, Claim] = {}
    for line in path.read_text().splitlines():
        found = _ROW.match(line.strip())
        if found is None:
            continue
        profile, version, status, proved_by = (part.strip() for part in found.groups())
        status = status.strip("* ").lower()
        if status not in STATUSES:
            raise ValueError(f"{path}: {profile}'s claim is {status!r}, not one of {STATUSES}")
        claims[profile] = Claim(profile, version, status, proved_by)
    return claims


def claimed(path: Path) -> set[str]:
    return {name for name, claim in read_claims(path).items() if claim.status == "yes"}


@dataclass
class Outcomes:
    """Per profile: the node ids that passed, did not pass (failed, error, xfail) and were skipped (why)."""

    passed: dict[str, list[str]] = field(default_factory=lambda: defaultdict(list))
    not_passed: dict[str, list[str]] = field(default_factory=lambda: defaultdict(list))
    skipped: dict[str, list[str]] = field(default_factory=lambda: defaultdict(list))


_PROFILES = pytest.StashKey[dict[str, tuple[str, ...]]]()
_OUTCOMES = pytest.StashKey[Outcomes]()
_CLAIMED = pytest.StashKey[set[str]]()
_CONFIG: list[pytest.Config] = []


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", f"{MARKER}(*names): the PAMSPEC profiles this test proves "
                                       "(docs/implementation-report.md; tests/profile_claims.py gates claimed ones)")
    config.stash[_PROFILES] = {}
    config.stash[_OUTCOMES] = Outcomes()
    path = report_path()
    config.stash[_CLAIMED] = claimed(path) if path.is_file() else set()
    _CONFIG[:] = [config]  # pytest_runtest_logreport is handed the report only


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    profiles = config.stash[_PROFILES]
    for item in items:
        names = tuple(name for mark in item.iter_markers(MARKER) for name in mark.args)
        if names:
            profiles[item.nodeid] = names


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    if not _CONFIG:
        return
    config = _CONFIG[0]
    names = config.stash[_PROFILES].get(report.nodeid, ())
    outcomes = config.stash[_OUTCOMES]
    for name in names:
        if report.failed or hasattr(report, "wasxfail"):  # an xfail of a claimed profile is not a pass
            if report.nodeid not in outcomes.not_passed[name]:
                outcomes.not_passed[name].append(report.nodeid)
        elif report.skipped:
            reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
            outcomes.skipped[name].append(f"{report.nodeid} ({reason.removeprefix('Skipped: ')})")
        elif report.when == "call" and report.passed:
            outcomes.passed[name].append(report.nodeid)


def gate_failures(config: pytest.Config) -> dict[str, list[str]]:
    """Claimed profile -> its tests that ran and did not pass."""
    outcomes = config.stash[_OUTCOMES]
    return {name: tests for name, tests in sorted(outcomes.not_passed.items())
            if name in config.stash[_CLAIMED] and tests}


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    if gate_failures(session.config) and session.exitstatus == pytest.ExitCode.OK:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter, exitstatus: int,
                            config: pytest.Config) -> None:
    outcomes, claims = config.stash[_OUTCOMES], config.stash[_CLAIMED]
    ran = sorted(set(outcomes.passed) | set(outcomes.not_passed) | set(outcomes.skipped))
    if not ran:
        return
    terminalreporter.section("PAMSPEC profiles")
    failures = gate_failures(config)
    for name in ran:
        state = "claimed" if name in claims else "not claimed"
        counts = (f"{len(outcomes.passed.get(name, []))} passed, {len(outcomes.not_passed.get(name, []))} not "
                  f"passed, {len(outcomes.skipped.get(name, []))} skipped")
        terminalreporter.line(f"{name} ({state}): {counts}", red=name in failures)
        for test in outcomes.not_passed.get(name, []) if name in failures else []:
            terminalreporter.line(f"    not passed: {test}", red=True)
    skipped = sorted({test for name in ran for test in outcomes.skipped.get(name, [])})
    for test in skipped[:SHOWN_SKIPS]:
        terminalreporter.line(f"skipped: {test}")
    if len(skipped) > SHOWN_SKIPS:
        terminalreporter.line(f"... and {len(skipped) - SHOWN_SKIPS} more skipped (-rs lists every reason)")
    for name in failures:
        terminalreporter.line(f"claimed profile {name} has tests that did not pass: the report "
                              f"({report_path().name}) claims it, so this session fails", red=True, bold=True)
