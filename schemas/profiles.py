"""What pamledger claims of PAMSPEC: the draft it implements and the conformance profiles whose tests pass.

One list, read by the conformance adapter's `hello`, the MCP manifest and the README's first paragraph (a test
holds the README to it). PAMSPEC 18: a profile is claimed only when every mandatory requirement is met; these
are the ones the upstream conformance cases (tests/integration/test_conformance_adapter.py) exercise.
"""

from __future__ import annotations

SPEC_VERSION = "0.1-draft"  # schema_profile of pamspec-version.json
ARCHITECTURE_PROFILE = "0.1.0-draft"
CLAIMED_PROFILES: tuple[str, ...] = ("PAMSPEC-Lite", "PAMSPEC-Subscribe", "PAMSPEC-Delegation")
