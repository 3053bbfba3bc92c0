"""Content schemas of the standard types whose canonical_content PAMSPEC constrains.

tool_invocation, tool_result and working_memory content must match their official JSON Schemas; these
Structs mirror them (unknown fields rejected); `schemas.registry` loads them into the TypeRegistry whose
`check_content` applies them.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

import msgspec

from schemas.common import Id, Timestamp

_STRICT: dict[str, bool] = dict(frozen=True, kw_only=True, omit_defaults=True, forbid_unknown_fields=True)
NonNegative = Annotated[int, msgspec.Meta(ge=0)]


class SafetyCheckOutcome(msgspec.Struct, **_STRICT):
    checker: str | None = None
    outcome: Literal["allowed", "denied", "flagged", "not_evaluated"] | None = None
    rationale: str | None = None


class ToolInvocationContent(msgspec.Struct, **_STRICT):
    tool_name: Annotated[str, msgspec.Meta(min_length=1)]
    arguments: Any
    tool_version: str | None = None
    tool_ref: str | None = None
    arguments_schema_ref: str | None = None
    invocation_reason: str | None = None
    requested_by_actor_id: Id | None = None
    safety_check_outcome: SafetyCheckOutcome | None = None


class ToolError(msgspec.Struct, **_STRICT):
    code: str | None = None
    message: str | None = None
    retryable: bool | None = None


class Cost(msgspec.Struct, **_STRICT):
    amount: Annotated[float, msgspec.Meta(ge=0)] | None = None
    currency: str | None = None
    unit: str | None = None


class ResourceUsage(msgspec.Struct, **_STRICT):
    input_tokens: NonNegative | None = None
    output_tokens: NonNegative | None = None
    wall_clock_ms: NonNegative | None = None


class ToolResultContent(msgspec.Struct, **_STRICT):
    invocation_object_id: Id
    outcome: Literal["success", "error", "partial", "timeout", "cancelled"]
    invocation_version_id: Id | None = None
    result: Any = None
    result_schema_ref: str | None = None
    error: ToolError | None = None
    started_at: Timestamp | None = None
    completed_at: Timestamp | None = None
    latency_ms: NonNegative | None = None
    cost: Cost | None = None
    resource_usage: ResourceUsage | None = None


class PromotionHint(msgspec.Struct, **_STRICT):
    target_object_type: str | None = None
    confidence: Annotated[float, msgspec.Meta(ge=0, le=1)] | None = None
    rationale: str | None = None


class WorkingMemoryContent(msgspec.Struct, **_STRICT):
    task_ref: Id
    content: Any
    purpose: str | None = None
    ttl_hint_seconds: NonNegative | None = None
    producer_actor_id: Id | None = None
    supersedes_object_id: Id | None = None
    promotion_hint: PromotionHint | None = None


CONTENT_SCHEMAS: dict[str, type[msgspec.Struct]] = {
    "tool_invocation": ToolInvocationContent,
    "tool_result": ToolResultContent,
    "working_memory": WorkingMemoryContent,
}

