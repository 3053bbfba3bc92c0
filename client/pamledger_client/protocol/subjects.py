"""The NATS subject scheme, in one place (docs/protocol.md documents it)."""

from __future__ import annotations

import base64

DEFAULT_PREFIX = "pamledger"  # every subject starts with the prefix (PAMLEDGER_SUBJECT_PREFIX)

# The commands an agent may send (the rest of `{prefix}.cmd.*` is the service's own: open_subscription,
# record_*, register_embedding_space): what a credential's NATS login may publish.
COMMANDS = ("create", "update", "transition", "delete", "create_scope", "grant_delegation", "check_delegation",
            "revoke_delegation", "relate", "redact", "promote", "correct_provenance", "import_entries",
            "snapshot_create", "eval_start", "eval_end")
QUERIES = ("read", "history", "query", "search", "whoami", "related", "events", "export", "snapshots",
           "snapshot_diff")
# The Subscribe gateway's requests ({prefix}.sub.<call>): the gateway answers each, a credential may send each.
SUBSCRIPTION_CALLS = ("open", "poll", "ack", "resume", "close", "status", "list")


def scope_token(scope_id: str) -> str:
    """Scope ids may hold '.', '*', '>': subjects carry them base64url-encoded, unpadded."""
    return base64.urlsafe_b64encode(scope_id.encode()).decode().rstrip("=")


def decode_scope_token(token: str) -> str:
    return base64.urlsafe_b64decode(token + "=" * (-len(token) % 4)).decode()


def command_subject(prefix: str, command: str) -> str:
    return f"{prefix}.cmd.{command}"


def partition_command_subject(prefix: str, partition: int, command: str) -> str:
    """Where the router sends a command of a scope in `partition` (a ledger of several: infra.partitions)."""
    return f"{prefix}.cmd.p{partition}.{command}"


def query_subject(prefix: str, query: str) -> str:
    return f"{prefix}.query.{query}"


def status_subject(prefix: str, component: str) -> str:
    return f"{prefix}.status.{component}"


def ledger_subject(prefix: str, partition: int, scope_id: str, event_type: str) -> str:
    return f"{prefix}.ledger.p{partition}.{scope_token(scope_id)}.{event_type}"


def ledger_wildcard(prefix: str) -> str:
    return f"{prefix}.ledger.>"


def partition_wildcard(prefix: str, partition: int) -> str:
    """Every ledger event of one partition."""
    return f"{prefix}.ledger.p{partition}.>"


def scope_subject_base(prefix: str, partition: int, scope_id: str) -> str:
    """The subjects of one scope's events are this base, a dot, and the event type."""
    return f"{prefix}.ledger.p{partition}.{scope_token(scope_id)}"


def subscription_subject(prefix: str, call: str) -> str:
    return f"{prefix}.sub.{call}"


def push_subject(prefix: str, subscription_id: str) -> str:
    """Where a push subscription's events go when its request names no subject of its own."""
    return f"{prefix}.sub.deliver.{scope_token(subscription_id)}"
