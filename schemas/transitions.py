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

