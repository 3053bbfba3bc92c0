"""The section 9.5 transition tables, as the draft's machine-readable candidate table gives them.

These are the defaults `schemas.registry.default_registry` loads; the writer's core reads its tables from the
registry it is handed, not from here.
"""

from __future__ import annotations

TRANSITIONS: dict[str, dict[str, tuple[str, ...]]] = {
    "lifecycle": {
        "scratch": ("candidate", "archived"),
        "candidate": ("active", "deprecated", "archived"),
        "active": ("superseded", "deprecated", "archived"),
        "superseded": ("archived", "deprecated"),
        "deprecated": ("archived", "active"),
        "archived": ("active", "deprecated"),
    },
    "validation": {
        "unverified": ("corroborated", "disputed", "rejected"),
        "corroborated": ("disputed", "rejected", "unverified"),
        "disputed": ("corroborated", "rejected"),
        "rejected": ("disputed", "corroborated"),
    },
    "availability": {
        "available": ("partially_redacted", "redacted", "deleted"),
        "partially_redacted": ("available", "redacted", "deleted"),
        "redacted": ("available", "deleted"),
        "deleted": (),
    },
    "retention": {
        "retained": ("expired", "pending_deletion", "legal_hold"),
        "expired": ("retained", "pending_deletion", "legal_hold"),
        "pending_deletion": ("retained", "legal_hold"),
        "legal_hold": ("retained", "expired", "pending_deletion"),
    },
}


# The 9.5 tables qualify some allowed moves ("active with review policy", "available with restoration policy",
# "after hold release"): those need a policy_basis naming the policy, else policy_denied.
NEEDS_POLICY_BASIS: dict[str, dict[tuple[str, str], str]] = {
    "lifecycle": {("deprecated", "active"): "review policy"},
    "validation": {("corroborated", "unverified"): "provenance correction", ("rejected", "corroborated"): "review policy"},
    "availability": {("redacted", "available"): "restoration policy",
                     ("partially_redacted", "available"): "restoration policy"},
    "retention": {("legal_hold", "retained"): "hold release", ("legal_hold", "expired"): "hold release",
                  ("legal_hold", "pending_deletion"): "hold release"},
}

# The "Forbidden Without Policy Override" column: moves outside the table that an explicit policy override
# (policy_override, a policy_basis and, where auth is enforced, an administrator) may still make; and one move
# the Allowed column itself qualifies so (archived -> active "with policy override"). An override wins over the
# machine-readable table's plain allowance.
OVERRIDABLE: dict[str, dict[tuple[str, str], str]] = {
    "lifecycle": {
        ("scratch", "active"): "policy override", ("scratch", "superseded"): "policy override",
        ("scratch", "deprecated"): "policy override", ("candidate", "superseded"): "replacement reference",
        ("active", "scratch"): "policy override", ("superseded", "active"): "review policy",
        ("deprecated", "scratch"): "policy override", ("archived", "scratch"): "policy override",
        ("archived", "candidate"): "policy override",
        ("archived", "active"): "policy override",  # in the Allowed column, "active with policy override"
    },
    "validation": {("rejected", "unverified"): "review policy"},
    "availability": {},
    "retention": {},
}
