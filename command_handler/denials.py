"""The writer's side of authorization: ask the policy about a parsed command and, when it refuses, turn the
command into the `access_denied` entry that records the refusal.

Why in the batch: the writer cannot send itself a command, and it need not: the entry commits with the
batch, and the refused command is answered `access_denied` only after that COMMIT. If the batch fails,
the command answers the batch's error (`service_unavailable`): a refusal the ledger does not hold is never
given out (the audit fails closed). Entries the limiter leaves out are answered at once and counted in the
next one recorded for the same caller and rule.
"""

from __future__ import annotations

import msgspec

from command_handler.intake import Parsed
from infra.authz.audit import DenialLimiter, limiter_key
from infra.authz.enforce import entry_for
from infra.request_shell import Deny, Policy, authorize, context_of
from schemas.commands import RecordAccessDenied
from schemas.errors import PamledgerError


def admit(policy: Policy, limiter: DenialLimiter, parsed: Parsed, subject: str,
          headers: dict[str, str] | None) -> Parsed | PamledgerError:
    """`parsed` when the policy allows it; else the entry recording the refusal (answered with the refusal),
    or the refusal alone when the limiter leaves the entry out."""
    context = msgspec.structs.replace(context_of(subject, headers), operation_id=parsed.operation_id)
    context, decision = authorize(policy, context, parsed.command, f"cmd.{parsed.name}")
    if not isinstance(decision, Deny):
        return parsed
    refusal = decision.error()
    suppressed = limiter.admit(limiter_key(decision.caller, decision.rule_id))
    if suppressed is None:
        return refusal
    entry = entry_for(context, f"cmd.{parsed.name}", decision)
    entry["denial"]["suppressed"] = suppressed  # type: ignore[index]
    entry["operation_id"] = parsed.operation_id or entry["operation_id"]
    command = msgspec.convert(entry, RecordAccessDenied)
    return Parsed(name="record_access_denied", command=command, operation_id=command.operation_id,
                  idempotency_key=None, request_digest="", refusal=refusal)
