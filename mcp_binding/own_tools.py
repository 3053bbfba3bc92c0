"""pamledger's own MCP tools (prefixed `pamledger.`): what the NATS binding offers beyond the PAMSPEC twelve.

Each takes the fields of its NATS request (docs/protocol.md) under the same names; `actor` defaults to the
token's actor like every write of the binding.
"""

from __future__ import annotations

from typing import Any

from mcp_binding.tool_spec import ToolSpec, tool

_STRING: dict[str, Any] = {"type": "string"}
_STRINGS: dict[str, Any] = {"type": "array", "items": {"type": "string"}}
_ACTOR: dict[str, Any] = {"type": "object", "description": "who acts (default: your token's actor)"}
_FILTERS: dict[str, Any] = {
    "type": "object",
    "description": "structured filters as in pamspec.query's `filters` (object_type, validation_state, ...) or "
                   "the NATS binding's names (object_types, validation_states, time, quality, ...); default: "
                   "trusted memory only (active, available, retained, corroborated)"}
_SNAPSHOT: dict[str, Any] = {"type": "string", "description": "answer as this sealed evaluation snapshot holds the "
                              "scope (pamledger.snapshot_create): the same answer whatever is written later"}

PAMLEDGER_TOOLS: tuple[ToolSpec, ...] = (
    tool("pamledger.search",
         "Search one scope by meaning, by words, or both fused (hybrid, the default) in one Embedding Space. "
         "Returns ranked envelopes with scores, the space used and the index's freshness.",
         required=["scope_id"],
         properties={
             "operation_id": _STRING,
             "scope_id": _STRING,
             "text": {"type": "string", "description": "what to look for (give text or vector)"},
             "vector": {"type": "array", "items": {"type": "number"}},
             "mode": {"enum": ["hybrid", "semantic", "lexical"]},
             "embedding_space_id": {"type": "string", "description": "default: the service's default space"},
             "filters": _FILTERS,
             "limit": {"type": "integer", "minimum": 1, "maximum": 500},
             "snapshot_id": _SNAPSHOT,
         }),
    tool("pamledger.related",
         "The relationships around an object and the objects they reach, up to 3 hops away.",
         required=["scope_id", "object_id"],
         properties={
             "operation_id": _STRING,
             "scope_id": _STRING,
             "object_id": _STRING,
             "relationship_types": _STRINGS,
             "direction": {"enum": ["outgoing", "incoming", "both"]},
             "hops": {"type": "integer", "minimum": 1, "maximum": 3},
             "limit": {"type": "integer", "minimum": 1, "maximum": 500},
             "snapshot_id": _SNAPSHOT,
         }),
    tool("pamledger.snapshot_diff",
         "Compare two sealed snapshots of one scope: objects added (in B only), removed (in A only) and changed "
         "(both, at other versions: their versions and events between the watermarks, as inspect_history shows "
         "them). One page in object id order; while `truncated`, pass `after_object_id` back. On an evaluation "
         "scope without to_snapshot_id: snapshot A of its base against the scope as the run left it.",
         required=["scope_id", "from_snapshot_id"],
         properties={
             "operation_id": _STRING,
             "scope_id": _STRING,
             "from_snapshot_id": {"type": "string", "description": "snapshot A"},
             "to_snapshot_id": {"type": "string", "description": "snapshot B (absent: the evaluation scope)"},
             "after_object_id": _STRING,
             "limit": {"type": "integer", "minimum": 1, "maximum": 1000},
         }),
    tool("pamledger.poll",
         "The next events of a subscription opened by pamspec.subscribe, in ledger order. Each poll acknowledges "
         "what it returns; `last_delivered_sequence` is the cursor (a later poll, from any session, goes on from "
         "it). Waits up to wait_ms for a first event.",
         required=["subscription_id"],
         properties={
             "subscription_id": _STRING,
             "max_events": {"type": "integer", "minimum": 1, "maximum": 1000},
             "wait_ms": {"type": "integer", "minimum": 0, "maximum": 30000},
         }),
    tool("pamledger.snapshot_create",
         "Seal an evaluation snapshot of one scope (PAMSPEC-Evaluation): what the scope holds at a ledger sequence "
         "(default: now), optionally only some objects. Returns the sealed descriptor; read and query it with "
         "snapshot_id, and the answers stay the same whatever is written later.",
         required=["scope_id", "snapshot"],
         properties={
             "scope_id": _STRING,
             "snapshot": {"type": "object", "description": "evaluation-snapshot.schema.json fields: snapshot_id "
                          "(required), ledger_sequence_high_watermark, included_object_ids, evaluation_run_id, "
                          "deterministic_clock, deterministic_rng_seed; the service seals it"},
             "actor": _ACTOR,
             "idempotency_key": _STRING,
             "operation_id": _STRING,
         }),
    tool("pamledger.eval_start",
         "Open an evaluation run (PAMSPEC-Evaluation) forked from a sealed snapshot of scope_id into a new "
         "evaluation scope: reads there see the snapshot's objects, writes land there only, with the snapshot's "
         "deterministic clock and seed, and every version names the run (provenance evidence_refs "
         "evaluation_run:<id>). No credential is made here (the administrator's `pamledger eval start` does).",
         required=["scope_id", "snapshot_id", "evaluation_scope_id"],
         properties={
             "scope_id": {"type": "string", "description": "the snapshot's scope"},
             "snapshot_id": _STRING,
             "evaluation_scope_id": {"type": "string", "description": "the new scope the run writes into"},
             "evaluation_run_id": {"type": "string", "description": "default: the snapshot's"},
             "actor": _ACTOR,
             "idempotency_key": _STRING,
             "operation_id": _STRING,
         }),
    tool("pamledger.eval_end",
         "Close the evaluation run of an evaluation scope: it stays readable and takes no more writes.",
         required=["scope_id"],
         properties={
             "scope_id": {"type": "string", "description": "the evaluation scope"},
             "actor": _ACTOR,
             "idempotency_key": _STRING,
             "operation_id": _STRING,
         }),
    tool("pamledger.create_scope",
         "Register a Memory Scope (creating one that exists is a no-op).",
         required=["scope_id"],
         properties={
             "scope_id": _STRING,
             "scope_kind": {"type": "string", "description": "default: workspace"},
             "parent_scope_id": _STRING,
             "policy": {"type": "object"},
         }),
    tool("pamledger.grant_delegation",
         "Let another actor act for you in a scope, for some operations, within a time window (PAMSPEC-Delegation).",
         required=["scope_id", "delegated_actor", "granted_operations", "policy_basis", "not_before", "not_after"],
         properties={
             "operation_id": _STRING,
             "idempotency_key": _STRING,
             "scope_id": _STRING,
             "granting_actor": {"type": "object", "description": "default: your token's actor"},
             "delegated_actor": {"type": "object"},
             "granted_operations": _STRINGS,
             "policy_basis": _STRING,
             "not_before": _STRING,
             "not_after": _STRING,
             "delegation_id": _STRING,
             "usage_limit": {"type": "integer", "minimum": 1},
             "granted_object_ids": _STRINGS,
             "granted_object_types": _STRINGS,
             "target_scope_id": _STRING,
             "revocable": {"type": "boolean"},
             "actor": _ACTOR,
         }),
    tool("pamledger.check_delegation",
         "Exercise a delegation once for an operation (a counted use): the grant, or access_denied.",
         required=["scope_id", "delegation_id", "operation"],
         properties={
             "operation_id": _STRING,
             "idempotency_key": _STRING,
             "scope_id": _STRING,
             "delegation_id": _STRING,
             "delegated_actor_id": {"type": "string", "description": "default: your token's actor"},
             "operation": _STRING,
             "object_id": _STRING,
             "object_type": _STRING,
             "actor": _ACTOR,
         }),
    tool("pamledger.revoke_delegation",
         "End a delegation at once (its granting actor or an administrator).",
         required=["scope_id", "delegation_id"],
         properties={
             "operation_id": _STRING,
             "idempotency_key": _STRING,
             "scope_id": _STRING,
             "delegation_id": _STRING,
             "reason": _STRING,
             "actor": _ACTOR,
         }),
)
