"""The one decision function: (grants, credential, request, time) -> allow with the caller, or deny with a rule id.

Pure (no I/O, no clock of its own: `now` is an argument), so every rule is tested as a table and the
writer, the query service and the Subscribe gateway decide the same way. The grants snapshot it reads
comes from authz.registry; recording denials is authz.audit's.

Rules, in the order they are checked (the first that fails names the denial):
  auth.missing_credential / auth.malformed_credential   no or a malformed `Authorization: Bearer` header
  auth.unknown_credential      no live credential has this id, or the digest differs (said the same way)
  auth.expired_credential      the credential's not_after has passed
  auth.unknown_actor           the credential's actor was revoked (its record deleted)
  authz.unknown_operation      a request kind the policy does not know (fails closed)
  authz.internal_only          a service-to-service command from a caller that is not the service
  authz.actor_mismatch         the command's actor (or the Pam-Actor header) is not the authenticated actor
  authz.provenance_actor_mismatch  a write's provenance.actor is neither the authenticated actor nor the
                               principal (on_behalf_of_actor_id) of the delegation it is made under
  delegation.not_found         acting on_behalf_of another without a delegation_id, or a read under one (a
                               create/update/transition/delete under one is the writer's to check and count)
  authz.scope_not_granted      no grant of the actor covers the scope (the system scope only by its exact id)
  authz.operation_not_granted  a grant covers the scope but not the operation (or not every operation a
                               request needs: an export or a snapshot diff needs read and
                               inspect_history)
  authz.import_needs_administrator  an import replays history others wrote: the administrator's alone
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime

from authz.tokens import BadCredential, bearer_token, digest_matches
from schemas.auth import ALL_OPERATIONS, ActorRecord, Claim, CredentialRecord, scope_matches
from schemas.common import SYSTEM_SCOPE
from pamledger_client.protocol.vocabulary import ADMIN_ACTOR_ID as ADMIN_ACTOR_ID

_NO_DIGEST = "sha256:" + "0" * 64
SERVICE_ACTOR_ID = "actor:pamledger:service"
RETENTION_ACTOR_ID = "actor:pamledger:retention"  # the retention evaluator's transitions (retention/)

# Request kinds (as the request shell and the writer name them) -> the PAMSPEC operation a grant must hold.
REQUEST_OPERATIONS: Mapping[str, str] = {
    "cmd.create": "create", "cmd.update": "update", "cmd.transition": "transition", "cmd.delete": "delete",
    "cmd.relate": "relate", "cmd.redact": "redact", "cmd.promote": "promote", "cmd.correct_provenance": "update",
    "cmd.create_scope": "create", "cmd.register_embedding_space": "create",
    "query.read": "read", "query.history": "inspect_history", "query.query": "query", "query.search": "query",
    "query.whoami": "read",  # scopeless: any authenticated caller may ask who it is
    "status": "read",  # scopeless: any authenticated caller sees a role's health (details: infra.status)
    "query.related": "read",  # each object a traversal returns is a read of it (and of its scope: every step)
    "query.events": "inspect_history",  # a scope's ledger events in order (Inspect History of the whole scope)
    "query.export": "read",  # and inspect_history (ALSO_NEEDS): a scope's whole memory and its ledger
    "cmd.import_entries": "create",  # and administering the service (authorize)
    "cmd.snapshot_create": "read",  # sealing a snapshot writes no memory: it pins what the caller may read
    "cmd.eval_start": "read",  # forks a snapshot of a scope the caller may read into a new evaluation scope
    "cmd.eval_end": "create",  # on the evaluation scope: whoever may write there may close the run
    "query.snapshots": "read",  # a scope's sealed snapshots (list) or one of them (show)
    "query.snapshot_diff": "read",  # and inspect_history (ALSO_NEEDS): two snapshots' versions and ledger events
    "sub.open": "subscribe", "sub.poll": "subscribe", "sub.ack": "subscribe", "sub.resume": "subscribe",
    "sub.status": "subscribe", "sub.close": "unsubscribe", "sub.list": "subscribe",
}
# Requests that need more than their one operation on the scope.
ALSO_NEEDS: Mapping[str, tuple[str, ...]] = {"query.export": ("inspect_history",),
                                             "query.snapshot_diff": ("inspect_history",)}
# Commands only the service's own roles send (the gateway, the indexer, the denial audit).
INTERNAL_COMMANDS = frozenset({"cmd.open_subscription", "cmd.close_subscription", "cmd.record_index_event",
                               "cmd.record_access_denied"})
# Requests that name no scope: they act on one subscription, which the gateway checks belongs to the caller.
# What the service's roles may send besides INTERNAL_COMMANDS (the indexer registers its default space), for
# any actor their command names.
SERVICE_REQUESTS = INTERNAL_COMMANDS | {"cmd.register_embedding_space", "cmd.check_delegation", "status"}
# What the service credential may send only in the name of one actor of its own: the retention evaluator's
# transitions (no delegation, no on-behalf-of; the actor holds no grant, so never a policy override).
SERVICE_ACTS_AS: Mapping[str, str] = {"cmd.transition": RETENTION_ACTOR_ID}
SCOPELESS = frozenset({"sub.poll", "sub.ack", "sub.resume", "sub.status", "sub.close", "sub.list", "query.whoami",
                       "status"})
# Commands that may be made under a delegation (actor.delegation_id): the delegation stands in for the grant.
DELEGABLE = frozenset({"cmd.create", "cmd.update", "cmd.transition", "cmd.delete", "cmd.relate", "cmd.redact",
                       "cmd.promote", "cmd.correct_provenance"})
# Reads that may be made under one (the Pam-Actor header's delegation_id): the shell has the writer exercise it
# (authz.exercise) before the handler runs.
DELEGABLE_READS = frozenset({"query.read", "query.history", "query.query", "query.search", "query.related",
                             "sub.open"})  # a subscription under one: the gateway closes it when it ends
# Delegation commands: the caller must be the command's actor; who may grant, check or revoke what is the
# writer's core's to decide (command_handler/core/delegations.py), against the grantor's grants.
DECIDED_BY_THE_WRITER = frozenset({"cmd.grant_delegation", "cmd.check_delegation", "cmd.revoke_delegation"})


@dataclass(frozen=True)
class Caller:
    """An authenticated caller: its actor record and the credential it used."""

    actor: ActorRecord
    token_id: str
    internal: bool = False  # the service's own roles

    @property
    def actor_id(self) -> str:
        return self.actor.actor_id


@dataclass(frozen=True)
class Grants:
    """Everything the policy knows at one moment: live credentials by token id and actor records by id."""

    credentials: Mapping[str, CredentialRecord] = field(default_factory=dict)
    actors: Mapping[str, ActorRecord] = field(default_factory=dict)
    internal_actor_ids: frozenset[str] = frozenset({SERVICE_ACTOR_ID})
    through_sequence: int = 0  # the ledger sequence these grants reflect (0: bootstrap credentials only)


@dataclass(frozen=True)
class Denied:
    rule_id: str
    message: str
    caller: Caller | None = None  # who was refused, when authenticated
    code: str = "access_denied"


def authenticate(grants: Grants, header: str | None, now: datetime) -> Caller | Denied:
    """The caller a `Bearer` header proves, or why not. Unknown id and wrong secret answer alike."""
    try:
        token = bearer_token(header)  # checked whole: `pam_<16 hex id>_<secret>`
        token_id = token[4:20]
    except BadCredential as exc:
        return Denied(exc.rule_id, str(exc))
    credential = grants.credentials.get(token_id)
    # A digest is computed and compared either way, so an unknown id costs what a wrong secret does.
    matches = digest_matches(credential.token_digest if credential is not None else _NO_DIGEST, token)
    if credential is None or not matches:
        return Denied("auth.unknown_credential", "the credential is not valid")
    refused = refusal_of(grants, credential, now)
    if refused is not None:
        return refused
    actor = grants.actors[credential.actor_id]
    return Caller(actor, token_id, internal=actor.actor_id in grants.internal_actor_ids)


def refusal_of(grants: Grants, credential: CredentialRecord, now: datetime) -> Denied | None:
    """Why a known credential no longer works (expired, or its actor revoked), or None: it is live."""
    if credential.not_after is not None and now > credential.not_after:
        return Denied("auth.expired_credential", "the credential has expired")
    if credential.actor_id not in grants.actors:
        return Denied("auth.unknown_actor", "the credential's actor is no longer registered")
    return None


def holds(actor: ActorRecord, scope_id: str, operation: str) -> str | None:
    """None when a grant of `actor` covers `operation` on `scope_id`, else the rule that refuses it."""
    covering = [g for g in actor.grants if any(scope_matches(p, scope_id) for p in g.scopes)]
    if not covering:
        return "authz.scope_not_granted"
    if any(ALL_OPERATIONS in g.operations or operation in g.operations for g in covering):
        return None
    return "authz.operation_not_granted"


def authorize(caller: Caller, request: str, scope_id: str | None, claim: Claim | None) -> Denied | None:
    """None when `caller` may make `request` (a request kind, e.g. "cmd.create") on `scope_id`."""
    if caller.internal:
        if request in SERVICE_REQUESTS:
            return None
        acts_as = SERVICE_ACTS_AS.get(request, "")
        if claim is not None and claim == Claim(acts_as, provenance_actor_id=claim.provenance_actor_id):
            if claim.provenance_actor_id not in (None, acts_as):
                return _provenance_mismatch(caller)
            return None
        return Denied("authz.operation_not_granted", "the service credential only sends service commands", caller)
    if request in INTERNAL_COMMANDS:
        return Denied("authz.internal_only", "only the service sends this command", caller)
    if request in DECIDED_BY_THE_WRITER:
        mismatch = claim is None or claim.actor_id != caller.actor_id
        return Denied("authz.actor_mismatch", "the command's actor must be the authenticated one", caller) \
            if mismatch else None
    operation = REQUEST_OPERATIONS.get(request)
    if operation is None:
        return Denied("authz.unknown_operation", f"no policy covers {request!r}", caller)
    if claim is not None:
        if claim.actor_id != caller.actor_id:
            return Denied("authz.actor_mismatch", "the request names an actor other than the authenticated one",
                          caller)
        if claim.provenance_actor_id is not None and claim.provenance_actor_id not in _provenance_actors(claim):
            return _provenance_mismatch(caller)
        if claim.delegation_id is not None and request in DELEGABLE | DELEGABLE_READS:
            return None  # the writer checks the delegation and counts the use (reads: through the shell)
        # A subscription's follow-ups (poll, ack, resume, status, close, list) name the actor it was opened as:
        # the gateway holds them to its owner, and closes a delegated one when its delegation ends.
        if (claim.on_behalf_of_actor_id is not None or claim.delegation_id is not None) and request not in SCOPELESS:
            return Denied("delegation.not_found", "acting for another actor needs a delegation", caller)
    if request in SCOPELESS:
        return None
    if scope_id is None:
        return Denied("authz.scope_not_granted", "the request names no scope", caller)
    for needed in (operation, *ALSO_NEEDS.get(request, ())):
        rule = holds(caller.actor, scope_id, needed)
        if rule is not None:
            return Denied(rule, f"not allowed to {needed} in this scope", caller)
    if request == "cmd.import_entries" and holds(caller.actor, SYSTEM_SCOPE, "create") is not None:
        return Denied("authz.import_needs_administrator", "an import replays history that others wrote: only"
                      " an administrator of the service imports", caller)
    return None


def _provenance_actors(claim: Claim) -> tuple[str, ...]:
    """Who a write's provenance may name: the authenticated actor (the claim's, once it matched), or under a
    delegation its principal (the writer checks that the delegation was granted by that actor)."""
    if claim.delegation_id is not None and claim.on_behalf_of_actor_id is not None:
        return claim.actor_id, claim.on_behalf_of_actor_id
    return (claim.actor_id,)


def _provenance_mismatch(caller: Caller) -> Denied:
    return Denied("authz.provenance_actor_mismatch", "provenance.actor must be the authenticated actor (or the"
                  " principal of the delegation the write is made under)", caller)


def decide(grants: Grants, header: str | None, request: str, scope_id: str | None, claim: Claim | None,
           now: datetime) -> Caller | Denied:
    """Authenticate, then authorize: the caller, or the first rule that refuses."""
    caller = authenticate(grants, header, now)
    if isinstance(caller, Denied):
        return caller
    return authorize(caller, request, scope_id, claim) or caller
