"""The policy port filled: TokenPolicy decides each request from the grants snapshot (authz.policy), and
RecordedDenials records each denial of the query service and the gateway before it is answered."""

from __future__ import annotations

from datetime import datetime, timezone

from authz.audit import DenialRecorder, denial_entry
from authz.policy import DELEGABLE_READS, Denied, decide, holds, refusal_of
from authz.registry import GrantsRegistry
from infra.request_shell import Allow, Decision, Deny, Principal, RequestContext
from schemas.common import SYSTEM_SCOPE
from schemas.errors import ServiceUnavailable


class TokenPolicy:
    """Every request needs a credential the grants snapshot knows, and a grant for what it asks."""

    enforced = True

    def __init__(self, registry: GrantsRegistry):
        self.registry = registry

    def decide(self, context: RequestContext, operation: str) -> Decision:
        if self.registry.stale():
            raise ServiceUnavailable("the grants could not be refreshed lately (database unavailable): retry")
        grants = self.registry.grants
        outcome = decide(grants, context.credential, operation, context.scope_id, context.claim,
                         datetime.now(timezone.utc))
        if isinstance(outcome, Denied):
            if outcome.rule_id == "auth.unknown_credential" and not self.registry.loaded.is_set():
                raise ServiceUnavailable("credentials are not loaded yet (database unavailable): retry")
            caller = outcome.caller
            return Deny(outcome.rule_id, outcome.code, outcome.message,  # type: ignore[arg-type]
                        caller={"actor_id": caller.actor_id, "actor_kind": caller.actor.actor_kind} if caller else None,
                        token_id=caller.token_id if caller else None)
        claim = context.claim
        delegated = claim.delegation_id if claim is not None and operation in DELEGABLE_READS else None
        return Allow(Principal(actor_id=outcome.actor_id, actor_kind=outcome.actor.actor_kind,
                               on_behalf_of_actor_id=claim.on_behalf_of_actor_id if claim and delegated else None,
                               delegation_id=delegated), delegation_id=delegated)

    def holds(self, actor_id: str, scope_id: str, operation: str) -> bool:
        """Whether `actor_id` holds `operation` on `scope_id` by its own grants now (a delegation's grantor)."""
        actor = self.registry.grants.actors.get(actor_id)
        return actor is not None and holds(actor, scope_id, operation) is None

    def grants_of(self, actor_id: str) -> list[dict[str, list[str]]]:
        """`actor_id`'s own grants now ({scopes, operations} each), for whoami: a caller may know what it holds."""
        actor = self.registry.grants.actors.get(actor_id)
        return [] if actor is None else [{"scopes": list(g.scopes), "operations": list(g.operations)}
                                         for g in actor.grants]

    def administers(self, actor_id: str) -> bool:
        """An administrator: one that may write the system scope (actors, credentials)."""
        return self.holds(actor_id, SYSTEM_SCOPE, "create")


def entry_for(context: RequestContext, operation: str, decision: Deny) -> dict[str, object]:
    """The `record_access_denied` body for a denial the shell or the writer made."""
    return denial_entry(operation, decision.rule_id, decision.code, context.scope_id, decision.caller,
                        decision.token_id, context.claim.actor_id if context.claim else None)


class RecordedDenials:
    """The request shell's DenialSink: each denial goes to the writer as an access_denied entry (rate-limited)."""

    def __init__(self, recorder: DenialRecorder):
        self.recorder = recorder

    async def denied(self, context: RequestContext, operation: str, decision: Deny) -> None:
        await self.recorder.record(entry_for(context, operation, decision))


class GrantsAuthorizer:
    """Subscribe's per-event check (subscriptions.filters.Authorizer): an event is delivered only while the
    subscription's actor is registered and holds `subscribe` on the scope, so a revocation stops delivery
    (the gateway then closes the subscription with `access_revoked` at the last delivered sequence)."""

    def __init__(self, registry: GrantsRegistry):
        self.registry = registry

    def allows(self, actor: dict[str, object], scope_id: str, event: dict[str, object]) -> bool:
        """Under a delegation, the principal who granted it must still hold `subscribe` (the delegation
        lends its grantor's rights; the gateway closes the subscription when the delegation ends)."""
        if event.get("scope_id") != scope_id:
            return False
        delegated = actor.get("delegation_id") is not None and actor.get("on_behalf_of_actor_id") is not None
        holder = actor.get("on_behalf_of_actor_id") if delegated else actor.get("actor_id")
        record = self.registry.grants.actors.get(str(holder))
        return record is not None and holds(record, scope_id, "subscribe") is None

    def credential_live(self, credential_id: str) -> bool:
        """The token is still a live credential (revoking deletes its record; expiry and a revoked actor
        refuse it as authentication would)."""
        grants = self.registry.grants
        credential = grants.credentials.get(credential_id)
        return credential is not None and refusal_of(grants, credential, datetime.now(timezone.utc)) is None
