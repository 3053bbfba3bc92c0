"""The writer's side of authorization: ask the policy about a parsed command and, when it refuses, turn the
command into the `access_denied` entry that records the refusal.

Why in the batch: the writer cannot send itself a command, and it need not: the entry commits with the
batch, and the refused command is answered `access_denied` only after that COMMIT. If the batch fails,
the command answers the batch's error (`service_unavailable`): a refusal the ledger does not hold is never
given out (the audit fails closed). Entries the limiter leaves out are answered at once and counted in the
next one recorded for the same caller and rule.
"""

from __future__ import annotations

from typing import Any

import msgspec

from authz.audit import DenialLimiter, denial_entry
from authz.enforce import entry_for
from command_handler.core.intake import Parsed
from command_handler.core.state import EVERYTHING, Authority
from infra.request_shell import Deny, Policy, authorize, context_of
from schemas.commands import RecordAccessDenied
from schemas.errors import AccessDenied, PamledgerError


def admit(policy: Policy, limiter: DenialLimiter, parsed: Parsed, subject: str,
          headers: dict[str, str] | None) -> Parsed | PamledgerError:
    """`parsed` when the policy allows it; else the entry recording the refusal (answered with the refusal),
    or the refusal alone when the limiter leaves the entry out."""
    context = msgspec.structs.replace(context_of(subject, headers), operation_id=parsed.operation_id)
    context, decision = authorize(policy, context, parsed.command, f"cmd.{parsed.name}")
    if not isinstance(decision, Deny):
        return parsed
    refusal = decision.error()
    return _recorded(limiter, entry_for(context, f"cmd.{parsed.name}", decision), parsed, refusal) or refusal


def refusal_entry(limiter: DenialLimiter, parsed: Parsed, refusal: AccessDenied) -> Parsed | None:
    """The access_denied entry recording a refusal the core made (a delegation check), answered with it; None
    when the limiter leaves it out."""
    actor = getattr(parsed.command, "actor", None)
    caller = {"actor_id": actor.actor_id, "actor_kind": actor.actor_kind} if actor is not None else None
    entry = denial_entry(f"cmd.{parsed.name}", refusal.rule_id, refusal.code, parsed.scope_id, caller, None, None)
    return _recorded(limiter, entry, parsed, refusal)


def _recorded(limiter: DenialLimiter, entry: dict[str, Any], parsed: Parsed, refusal: AccessDenied) -> Parsed | None:
    """The entry as a command of the batch, answered with `refusal` once it commits; None: left out."""
    if not limiter.admit_entry(entry):
        return None
    entry["operation_id"] = parsed.operation_id or entry["operation_id"]
    command = msgspec.convert(entry, RecordAccessDenied)
    return Parsed(name="record_access_denied", command=command, operation_id=command.operation_id,
                  idempotency_key=None, request_digest="", refusal=refusal)


def authority_of(policy: Policy) -> Authority:
    """What the delegation rules ask about actors' grants: the policy's answer with auth enforced, else
    EVERYTHING (the planner then skips the checks)."""
    return policy if policy.enforced else EVERYTHING
