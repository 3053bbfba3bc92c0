"""Every Prometheus metric pamledger exports, defined here once (prometheus-client's process registry).

Labels are bounded sets only: command and request names the service knows (anything else counts as
`unknown`), outcomes, rule ids of the policy, follower names, query kinds. Never a scope, object, actor or
token id, and never memory content. Each role process serves them at `/metrics` (infra.probes).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from prometheus_client import Counter, Gauge, Histogram

from pamledger_client.protocol.subjects import QUERIES
from schemas.commands import COMMAND_TYPES

QUERY_KINDS = frozenset(QUERIES)
_LATENCY = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)

COMMANDS_TOTAL = Counter("pamledger_commands_total", "Commands the writer answered, by command and outcome"
                         " (committed, replayed, rejected, denied, failed)", ["command", "outcome"])
BATCH_SIZE = Histogram("pamledger_writer_batch_commands", "Commands per group commit",
                       buckets=(1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024))
COMMIT_SECONDS = Histogram("pamledger_writer_commit_seconds", "Plan and append of one group commit (its COMMIT"
                           " included)", buckets=_LATENCY)
REPLY_SECONDS = Histogram("pamledger_writer_reply_seconds", "From a batch's start to its last reply",
                          buckets=_LATENCY)
LEDGER_HEAD = Gauge("pamledger_ledger_head", "The ledger sequence the writer last committed")
RELAY_LAG = Gauge("pamledger_relay_lag_events", "Committed ledger entries the relay has not yet published")
# With several partitions (infra.partitions) the two above are partition 0's; these are each partition's.
PARTITION_HEAD = Gauge("pamledger_partition_ledger_head", "The ledger sequence a partition's writer last committed",
                       ["partition"])
PARTITION_RELAY_LAG = Gauge("pamledger_partition_relay_lag_events",
                            "Committed entries of a partition its relay has not yet published", ["partition"])
FOLLOWER_POSITION = Gauge("pamledger_follower_applied_sequence", "The ledger sequence a follower has applied",
                          ["follower"])
FOLLOWER_STUCK = Gauge("pamledger_follower_stuck", "1 while a follower retries an event it cannot apply",
                       ["follower"])
QUERY_SECONDS = Histogram("pamledger_query_seconds", "Query service requests by kind and outcome (ok, error)",
                          ["kind", "outcome"], buckets=_LATENCY)
DENIALS_TOTAL = Counter("pamledger_denials_total", "Requests the policy refused, by rule", ["rule"])
LEADER = Gauge("pamledger_role_leader", "1 while this process leads the role (writer, followers, gateway)",
               ["role"])


def command_label(name: str) -> str:
    """A command name as a label value: the known ones, else `unknown` (a subject is the client's to choose)."""
    return name if name in COMMAND_TYPES else "unknown"


def query_label(name: str) -> str:
    return name if name in QUERY_KINDS else "unknown"


def rule_label(rule_id: str | None) -> str:
    """A denial's rule id (the policy's own, a bounded set) or `unknown`."""
    return rule_id if rule_id and len(rule_id) <= 80 and rule_id.replace(".", "").replace("_", "").isalnum() \
        else "unknown"


_command_counters: dict[tuple[str, str], Any] = {}  # labels() costs a lock and a lookup: once per pair


def count_commands(names_and_outcomes: Iterable[tuple[str, str]]) -> None:
    """Count a batch's commands: one increment per (command, outcome) pair it holds."""
    tally: dict[tuple[str, str], int] = {}
    for name, outcome in names_and_outcomes:
        pair = (command_label(name), outcome)  # bounded before it becomes a key: names are the client's
        tally[pair] = tally.get(pair, 0) + 1
    for pair, count in tally.items():
        counter = _command_counters.get(pair)
        if counter is None:
            counter = _command_counters[pair] = COMMANDS_TOTAL.labels(*pair)
        counter.inc(count)


_leading: set[str] = set()


def leads(role: str, now: bool) -> None:
    """Say whether this process leads `role` (the gauge, and /readyz's `leading`)."""
    LEADER.labels(role).set(1 if now else 0)
    if now:
        _leading.add(role)
    else:
        _leading.discard(role)


def leading(roles: Iterable[str]) -> list[str]:
    """Which of these roles this process leads now (the others stand by, or take no lock: query)."""
    return [role for role in roles if role in _leading]
