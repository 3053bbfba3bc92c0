"""The writer's spans for one batch, recorded after its replies went out (only while tracing is on).

A batch serves many commands, each with its own trace (the `traceparent` its request carried, else a new
one). The batch's steps are recorded once under each command's span rather than as one batch span linked
to them: a trace then holds the whole story of its command (command -> decide, commit -> relay -> apply),
which span links would split across traces most viewers do not join; `pamledger.batch_size` says how many
commands shared the steps' time.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

from infra import tracing
from infra.metrics import command_label


class BatchTimes(NamedTuple):
    """Wall-clock nanoseconds (what spans take) at the batch's start, decision, COMMIT and last reply."""

    started: int
    decided: int
    committed: int
    replied: int


class TracedCommand(NamedTuple):
    name: str  # the subject's last token: bounded by command_label before it is shown
    outcome: str  # infra.metrics outcome label: committed, rejected, replayed, denied
    operation_id: str | None
    headers: dict[str, str] | None


def trace_batch(commands: Sequence[TracedCommand], times: BatchTimes, ledger_sequence: int) -> None:
    """Record command, decide and commit spans per command, and leave each committed command's context for
    the relay (tracing.hand_over), which puts it on the ledger messages it publishes."""
    size = len(commands)
    for command in commands:
        attributes = {"pamledger.command": command_label(command.name), "pamledger.outcome": command.outcome,
                      "pamledger.batch_size": size}
        span = tracing.record("command", tracing.parent_of(command.headers), times.started, times.replied,
                              attributes)
        context = tracing.context_of(span)
        tracing.record("decide", context, times.started, times.decided, {"pamledger.batch_size": size})
        tracing.record("commit", context, times.decided, times.committed,
                       {"pamledger.batch_size": size, "pamledger.ledger_sequence": ledger_sequence})
        if command.outcome == "committed":
            tracing.hand_over(command.operation_id, context)
