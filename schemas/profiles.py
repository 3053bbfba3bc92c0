"""What pamledger claims of PAMSPEC: the draft it implements and the conformance profiles whose tests pass.

One list, read by the conformance adapter's `hello`, the MCP manifest and the README's first paragraph, and the
profiles docs/implementation-report.md claims (tests hold the README and the report to it). PAMSPEC 18: a
profile is claimed only when every mandatory requirement is met; the report names the test modules that show
each, and a test session that runs one of them fails when it does not pass (tests/profile_claims.py).
"""

from __future__ import annotations

SPEC_VERSION = "0.1-draft"  # schema_profile of pamspec-version.json
ARCHITECTURE_PROFILE = "0.1.0-draft"
CLAIMED_PROFILES: tuple[str, ...] = (
    "PAMSPEC-Lite", "PAMSPEC-Core", "PAMSPEC-Versioning", "PAMSPEC-Ledger", "PAMSPEC-Structured-Query", "PAMSPEC-Semantic-Query",
    "PAMSPEC-Relationship", "PAMSPEC-Protocol-Binding", "PAMSPEC-Subscribe", "PAMSPEC-Delegation",
    "PAMSPEC-Evaluation",
)
