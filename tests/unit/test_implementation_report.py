"""docs/implementation-report.md, the `profile(...)` markers and schemas/profiles.py say the same thing: every
claimed profile has marked tests, every marked profile is in the report, and what the report claims is what
the adapter, the MCP manifest and the README claim.

Why: the report is where PAMSPEC 18.12 wants the claims made, the markers are what tests/profile_claims.py
gates a session on, and schemas/profiles.py is what agents are told; a claim in one and not the others is a
claim nobody checks.
"""

from __future__ import annotations

import ast
import json
import re
from pathlib import Path

import pytest

from schemas.profiles import CLAIMED_PROFILES, SPEC_VERSION
from tests.conftest import PAMSPEC
from tests.profile_claims import MARKER, REPORT, read_claims

ROOT = Path(__file__).resolve().parents[2]
TESTS = ROOT / "tests"
LAYERED = ("PAMSPEC-Subscribe", "PAMSPEC-Delegation")  # draft 18.2 / 18.3, absent from pamspec-version.json


def marked_profiles() -> dict[str, set[str]]:
    """Profile name -> test modules (paths from the repository root) whose markers name it."""
    found: dict[str, set[str]] = {}
    for path in sorted(TESTS.rglob("test_*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == MARKER \
                    and isinstance(node.func.value, ast.Attribute) and node.func.value.attr == "mark":
                for arg in node.args:
                    assert isinstance(arg, ast.Constant) and isinstance(arg.value, str), f"{path}: a literal name"
                    found.setdefault(arg.value, set()).add(str(path.relative_to(ROOT)))
    return found


def test_the_report_claims_exactly_what_schemas_profiles_claims() -> None:
    claims = read_claims(REPORT)
    assert {name for name, claim in claims.items() if claim.status == "yes"} == set(CLAIMED_PROFILES)


def test_every_claimed_profile_has_marked_tests_in_the_modules_the_report_names() -> None:
    marked = marked_profiles()
    for name, claim in read_claims(REPORT).items():
        named = set(re.findall(r"tests/[\w/]+\.py", claim.proved_by))
        if claim.status == "yes":
            assert marked.get(name), f"{name} is claimed but no test module carries profile({name!r})"
        # what the table names carries the marker, and every marked module is named (a TODO names the pending)
        assert {m for m in named if (ROOT / m).exists()} <= marked.get(name, set()) | _pending(claim.proved_by), name
        assert marked.get(name, set()) <= named, f"{name}: marked but not named in the report: " \
                                                 f"{sorted(marked.get(name, set()) - named)}"


def _pending(cell: str) -> set[str]:
    """Modules a TODO in the cell says still need the marker."""
    return set(re.findall(r"TODO[^:]*:[^|]*?(tests/[\w/]+\.py)", cell))


def test_every_marked_profile_is_in_the_report() -> None:
    assert set(marked_profiles()) <= set(read_claims(REPORT)), sorted(set(marked_profiles()) - set(read_claims(REPORT)))


def test_every_profile_is_a_pamspec_profile_at_the_version_pamledger_implements() -> None:
    claims = read_claims(REPORT)
    assert {claim.version for claim in claims.values()} == {SPEC_VERSION}
    if not PAMSPEC.is_dir():
        pytest.skip(f"PAMSPEC files not found at {PAMSPEC} (../shared is absent)")
    pinned = json.loads((PAMSPEC / "pamspec-version.json").read_text())
    assert pinned["schema_profile"] == SPEC_VERSION
    assert set(claims) == set(pinned["conformance_profiles"]) | set(LAYERED)  # every profile is considered
    assert pinned["architecture_profile"] in REPORT.read_text() and pinned["test_vector_suite"] in REPORT.read_text()


def test_a_claim_that_cannot_be_read_is_an_error(tmp_path: Path) -> None:
    report = tmp_path / "report.md"
    report.write_text("| PAMSPEC-Lite | 0.1-draft | probably | tests/x.py |\n")
    with pytest.raises(ValueError, match="probably"):
        read_claims(report)
