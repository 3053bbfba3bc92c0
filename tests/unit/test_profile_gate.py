"""The claimed-profile gate (tests/profile_claims.py) really fails a session: a real pytest run over a tiny test
file whose tests are marked with a profile, against a report that claims it or not.

Why a subprocess: the gate acts at the end of a session (its exit status and summary); only a session of its
own shows that, and one whose only non-pass is an xfail shows the gate, not pytest, failing it.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
TESTS = '''
import pytest

pytestmark = pytest.mark.profile("PAMSPEC-Lite")


def test_holds() -> None:
    assert True


@pytest.mark.xfail(reason="known broken")
def test_known_broken() -> None:
    assert False


@pytest.mark.skip(reason="needs the shared files")
def test_skipped() -> None:
    pass


@pytest.mark.profile("PAMSPEC-Core")
def test_core_fails() -> None:
    assert {failing}
'''


def run_session(tmp_path: Path, claimed: str, core_fails: bool = False) -> subprocess.CompletedProcess[str]:
    folder = tmp_path / "suite"
    folder.mkdir(exist_ok=True)
    (folder / "test_synthetic.py").write_text(TESTS.replace("{failing}", "False" if core_fails else "True"))
    report = tmp_path / "report.md"
    report.write_text("| Profile | Version | Claimed | Proved by |\n|---|---|---|---|\n"
                      f"| PAMSPEC-Lite | 0.1-draft | {claimed} | test_synthetic.py |\n"
                      "| PAMSPEC-Core | 0.1-draft | no | test_synthetic.py |\n")
    env = {**os.environ, "PAMLEDGER_PROFILE_REPORT": str(report), "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, "-m", "pytest", "-p", "tests.profile_claims", "-p", "no:cacheprovider",
                           "-q", str(folder)], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)


def test_an_xfail_of_a_claimed_profile_fails_the_session_naming_profile_and_test(tmp_path: Path) -> None:
    done = run_session(tmp_path, claimed="yes")
    assert done.returncode == 1, done.stdout + done.stderr
    assert "2 passed, 1 skipped, 1 xfailed" in done.stdout  # pytest alone would exit 0
    assert "claimed profile PAMSPEC-Lite has tests that did not pass" in done.stdout
    assert "not passed: suite/test_synthetic.py::test_known_broken" in done.stdout
    assert "\nskipped: suite/test_synthetic.py::test_skipped (needs the shared files)" in done.stdout


def test_the_same_session_passes_when_the_profile_is_not_claimed(tmp_path: Path) -> None:
    done = run_session(tmp_path, claimed="pending")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "PAMSPEC-Lite (not claimed): 2 passed, 1 not passed, 1 skipped" in done.stdout
    assert "has tests that did not pass" not in done.stdout


def test_a_failing_test_of_an_unclaimed_profile_fails_as_any_test_but_not_the_claim(tmp_path: Path) -> None:
    done = run_session(tmp_path, claimed="pending", core_fails=True)
    assert done.returncode == 1
    assert "PAMSPEC-Core (not claimed): 0 passed, 1 not passed, 0 skipped" in done.stdout
    assert "claimed profile" not in done.stdout
