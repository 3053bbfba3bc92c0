"""What pamledger claims of PAMSPEC is said the same way everywhere: the README's first paragraph names every
claimed profile (schemas.profiles, which the adapter's hello and the MCP manifest read) and no other."""

from __future__ import annotations

import re
from pathlib import Path

from pamledger.conformance import hello
from schemas.profiles import CLAIMED_PROFILES

README = Path(__file__).resolve().parents[2] / "README.md"


def test_the_readme_opening_names_exactly_the_claimed_profiles() -> None:
    opening = README.read_text().split("\n\n")[2]  # after the title and the two commands
    assert set(re.findall(r"PAMSPEC-[A-Za-z-]+", opening)) == set(CLAIMED_PROFILES), opening
    assert "Lite today" not in README.read_text()


def test_the_adapter_says_the_same() -> None:
    assert hello()["profiles_supported"] == list(CLAIMED_PROFILES)
