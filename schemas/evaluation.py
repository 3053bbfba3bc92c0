"""Evaluation runs (PAMSPEC 18.11): the commands that open and close one, and what the ledger records of them.

`eval_start` forks an evaluation scope from a sealed snapshot: the command names the snapshot's scope (the
caller needs `read` there) and the new scope; the writer creates that scope and records the run as an
event-only `index_rebuilt` entry (action `evaluation_started`, PAMSPEC's event types being a closed list) in
it, the run's first entry, plus a row in its `evaluation_runs` table. The run's clock and seed are the
snapshot's `deterministic_clock` and `deterministic_rng_seed`; its id the snapshot's `evaluation_run_id` or
the command's. `eval_end` (in the evaluation scope) records `evaluation_ended`; the scope stays readable
and every later write in it is invalid_state_transition (rule `evaluation_run_ended`).
"""

from __future__ import annotations

import msgspec

from schemas.common import COMMAND_STRUCT, Id, IdempotencyKey
from schemas.envelope import Actor

STARTED_ACTION = "evaluation_started"
ENDED_ACTION = "evaluation_ended"
ENDED_RULE = "evaluation_run_ended"  # a write in the scope of an ended run
TAKEN_RULE = "evaluation_scope_taken"  # eval_start naming a scope that exists already
RUN_TAKEN_RULE = "evaluation_run_id_taken"  # eval_start naming a run id another run has
RUN_EVIDENCE_PREFIX = "evaluation_run:"  # the provenance evidence_refs entry naming a version's run
EVALUATION_SCOPE_KIND = "evaluation"


class StartEvaluation(msgspec.Struct, tag="eval_start", **COMMAND_STRUCT):
    """Open an evaluation run forked from a sealed snapshot of `scope_id` (needs `read` on it)."""

    scope_id: Id  # the snapshot's scope (the base)
    actor: Actor
    snapshot_id: Id
    evaluation_scope_id: Id  # the scope the run writes into: new
    evaluation_run_id: Id | None = None  # default: the snapshot's; both given must agree
    operation_id: Id | None = None
    idempotency_key: IdempotencyKey | None = None


class EndEvaluation(msgspec.Struct, tag="eval_end", **COMMAND_STRUCT):
    """Close the evaluation run of the evaluation scope `scope_id`: it stays readable, takes no more writes."""

    scope_id: Id
    actor: Actor
    operation_id: Id | None = None
    idempotency_key: IdempotencyKey | None = None


def run_evidence(run_id: str) -> str:
    return RUN_EVIDENCE_PREFIX + run_id
