"""One request shell: decode -> request context -> policy -> handler -> one error mapping -> reply.

Why one: the query service, the Subscribe gateway and the writer each had their own catch ladder, so a
failure could answer differently depending on where it happened, and authorization would have had three
places to go. Here every request gets a RequestContext (who asks, for what operation, in which scope, by
when) from the NATS message, the policy port decides on it before any handler runs ([M6] plugs real
decisions in at this single point: authz.enforce.TokenPolicy, or AllowAll where auth is off), a denial
is recorded (`DenialSink`) before it is answered, and every failure becomes the PAMSPEC error envelope through
`to_error`. Concurrency stays with the caller (per-request tasks, in-flight limits, batching).
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from typing import Annotated, Any, Literal, Protocol

import msgspec
import nats
import nats.js.errors
import psycopg
import structlog

from infra import tracing
from infra.metrics import DENIALS_TOTAL, query_label, rule_label
from infra.db_errors import map_db_error
from pamledger_client.protocol.tasks import reraise_if_cancelled
from schemas.common import Id
from schemas.errors import AccessDenied, InvalidRequest, PamledgerError, ServiceUnavailable
from schemas.headers import header_operation_id
from schemas.auth import AUTHORIZATION_HEADER, Claim
from schemas.replies import ACTOR_HEADER, error_reply
from pamledger_client.protocol.values import BadValue, check_text

log = structlog.get_logger(__name__)

MAX_ACTOR_HEADER_CHARS = 2048


class Principal(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True, omit_defaults=True):
    """Who the caller says it is (the `Pam-Actor` header): the credential proves `actor_id`; a read, query or
    search may name the delegation it is made under (`delegation_id`, `on_behalf_of_actor_id`)."""

    actor_id: Id
    actor_kind: Annotated[str, msgspec.Meta(min_length=1, max_length=128)]  # as in a command's actor
    on_behalf_of_actor_id: Id | None = None
    delegation_id: Id | None = None


ANONYMOUS = Principal(actor_id="actor:anonymous", actor_kind="anonymous")
_principal_decoder = msgspec.json.Decoder(Principal)


class Secret(str):
    """A credential as received: never shown by repr (contexts may end up in a log line)."""

    def __repr__(self) -> str:
        return "Secret(...)"


class RequestContext(msgspec.Struct, frozen=True, kw_only=True):
    """What every handler and the policy know of a request besides its body. `principal` is who the caller
    says it is (the Pam-Actor header) until the policy authenticates it, then who it proved to be."""

    principal: Principal
    subject: str
    operation_id: str | None = None
    scope_id: str | None = None
    deadline: float | None = None  # time.monotonic() by which the caller stops waiting, when known
    credential: Secret | None = None  # the Authorization header's value
    claim: Claim | None = None  # the actor the request names (its body's `actor`, else the Pam-Actor header)
    authenticated: bool = False

    @property
    def anonymous(self) -> bool:
        return self.principal == ANONYMOUS


class Allow(msgspec.Struct, frozen=True):
    """The policy lets the request through; `principal` is the caller it authenticated (None: not checked).
    `delegation_id`: allowed only if that delegation allows it: the shell exercises it before the handler."""

    principal: Principal | None = None
    delegation_id: str | None = None


class Deny(msgspec.Struct, frozen=True):
    """The policy refuses: answered with `code` naming `rule_id`, and the handler never runs. `caller` is the
    authenticated actor ({actor_id, actor_kind}) when there was one, `token_id` its credential."""

    rule_id: str
    code: Literal["access_denied", "policy_denied"] = "access_denied"
    message: str = "the request is not allowed"
    caller: dict[str, str] | None = None
    token_id: str | None = None

    def error(self) -> AccessDenied:
        return AccessDenied(self.message, rule_id=self.rule_id, code=self.code)


ALLOW = Allow()
Decision = Allow | Deny


class Policy(Protocol):
    """The port authorization fills: asked once per request, before its handler (`decide`), and by the
    services about actors' own grants: the writer's delegation rules (`holds`, `administers`), a traversal
    into another scope (`holds`), whoami (`grants_of`). `enforced` False: auth is off, nothing is checked."""

    enforced: bool

    def decide(self, context: RequestContext, operation: str) -> Decision: ...

    def holds(self, actor_id: str, scope_id: str, operation: str) -> bool: ...

    def administers(self, actor_id: str) -> bool: ...

    def grants_of(self, actor_id: str) -> list[dict[str, list[str]]]: ...


class AllowAll:
    """Auth off (settings auth.mode = "off"): every caller, anonymous included, may make every request, and
    every actor holds everything."""

    enforced = False

    def decide(self, context: RequestContext, operation: str) -> Decision:
        return ALLOW

    def holds(self, actor_id: str, scope_id: str, operation: str) -> bool:
        return True

    def administers(self, actor_id: str) -> bool:
        return True

    def grants_of(self, actor_id: str) -> list[dict[str, list[str]]]:
        return []  # no grant is checked: whoami says so with grants null (query.service)


class DenialSink(Protocol):
    """Where a denial is recorded before it is answered (authz.audit); raises to fail the request."""

    async def denied(self, context: RequestContext, operation: str, decision: Deny) -> None: ...


class DelegationGate(Protocol):
    """Exercises the delegation a request is made under (authz.exercise): returns once the writer has
    counted the use, raises AccessDenied (recorded by the writer) when the delegation does not allow it."""

    async def exercise(self, context: RequestContext, operation: str, request: Any, delegation_id: str) -> None: ...


def claim_of(request: Any, principal: Principal) -> Claim | None:
    """The actor a request names: its body's `actor` (commands, subscription opens), else a Pam-Actor header;
    with the actor its `provenance` names, when it has one (a write: the policy binds it to the caller)."""
    actor = getattr(request, "actor", None)
    if actor is not None and hasattr(actor, "actor_id"):
        provenance = getattr(getattr(request, "provenance", None), "actor", None)
        return Claim(actor.actor_id, getattr(actor, "on_behalf_of_actor_id", None), getattr(actor, "delegation_id", None),
                     getattr(provenance, "actor_id", None))
    if principal == ANONYMOUS:
        return None
    return Claim(principal.actor_id, principal.on_behalf_of_actor_id, principal.delegation_id)


def authorize(policy: Policy, context: RequestContext, request: Any, operation: str) -> tuple[RequestContext, Decision]:
    """Ask the policy about `request` (decoded); the context the handler gets names the authenticated caller."""
    context = msgspec.structs.replace(context, scope_id=getattr(request, "scope_id", None),
                                      claim=claim_of(request, context.principal))
    decision = policy.decide(context, operation)
    if isinstance(decision, Allow) and decision.principal is not None:
        context = msgspec.structs.replace(context, principal=decision.principal, authenticated=True)
    return context, decision


def principal_of(headers: dict[str, str] | None) -> Principal:
    """The caller named by the `Pam-Actor` header (JSON {actor_id, actor_kind}); anonymous without one.
    A header that is present but malformed is invalid_request: a caller that names itself wrongly is
    refused, never served as anonymous."""
    raw = (headers or {}).get(ACTOR_HEADER)
    if raw is None:
        return ANONYMOUS
    field = f"headers/{ACTOR_HEADER}"
    if len(raw) > MAX_ACTOR_HEADER_CHARS:
        raise InvalidRequest(f"header {ACTOR_HEADER} is longer than {MAX_ACTOR_HEADER_CHARS} characters",
                             details={"field": field, "limit_chars": MAX_ACTOR_HEADER_CHARS})
    try:
        principal = _principal_decoder.decode(raw)
        check_text(principal.actor_kind, f"{field}/actor_kind")
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        raise InvalidRequest(f"malformed {ACTOR_HEADER} header: {exc}",
                             details={"field": field, "reason": str(exc)}) from None
    except BadValue as exc:
        raise InvalidRequest(f"malformed {ACTOR_HEADER} header: {exc}",
                             details={"field": exc.path, "reason": exc.reason}) from None
    return principal


def context_of(subject: str, headers: dict[str, str] | None, budget_seconds: float | None = None) -> RequestContext:
    """The context of a request before its body is decoded (raises InvalidRequest for a bad actor header)."""
    deadline = time.monotonic() + budget_seconds if budget_seconds is not None else None
    operation_id = header_operation_id(headers)  # checked as the writer checks it: a bad one is invalid_request
    principal = principal_of(headers)
    raw = (headers or {}).get(AUTHORIZATION_HEADER)
    return RequestContext(principal=principal, subject=subject, operation_id=operation_id, deadline=deadline,
                          credential=Secret(raw) if raw is not None else None)


def to_error(exc: BaseException, what: str) -> PamledgerError:
    """The one mapping from anything a request can raise to the service's error; a bug is logged here, once.
    `what` names the request kind in that log line (never its content)."""
    if isinstance(exc, PamledgerError):
        return exc
    if isinstance(exc, (msgspec.DecodeError, msgspec.ValidationError)):
        return InvalidRequest(f"malformed {what} request: {exc}", details={"reason": str(exc)})
    if isinstance(exc, psycopg.Error):
        log.warning("request.database_failed", request=what, error=type(exc).__name__)
        return map_db_error(exc)
    if isinstance(exc, nats.js.errors.ServiceUnavailableError):  # 503: no JetStream leader yet (a cluster's
        # election after a node died): retryable, like NATS away
        return ServiceUnavailable(f"JetStream unavailable: {exc.description or 'no leader answered'}")
    if isinstance(exc, nats.js.errors.APIError):  # JetStream answered and refused: say what it said
        return PamledgerError(f"JetStream refused: {exc.description}", details={
            "err_code": exc.err_code, "description": exc.description})
    if isinstance(exc, nats.errors.Error):
        reraise_if_cancelled()
        return ServiceUnavailable(f"NATS unavailable: {type(exc).__name__}")
    log.error("request.crashed", request=what, exc_info=exc)
    return PamledgerError(f"internal error while handling the {what} request")


def error_body(exc: BaseException, operation_id: str | None, what: str) -> bytes:
    """The error envelope a failed request answers with."""
    return error_reply(to_error(exc, what), operation_id)


Handler = Callable[[Any, RequestContext], Awaitable[bytes]]


class RequestShell:
    """Runs one request through decode, context, policy and handler; always returns the reply bytes."""

    def __init__(self, policy: Policy | None = None, budget_seconds: float | None = None,
                 denials: DenialSink | None = None, delegations: DelegationGate | None = None):
        self.policy: Policy = policy or AllowAll()
        self.budget_seconds = budget_seconds
        self.denials = denials
        self.delegations = delegations

    async def answer(self, operation: str, subject: str, data: bytes, headers: dict[str, str] | None,
                     decode: Callable[[bytes], Any], handle: Handler) -> bytes:
        """`operation` names the request for the policy and the logs (e.g. "query.read", "sub.open")."""
        if tracing.ENABLED:
            with tracing.span(operation_label(operation), tracing.parent_of(headers), {}) as span:
                body = await self._answer(operation, subject, data, headers, decode, handle)
                span.set_attribute("pamledger.outcome", "error" if body.startswith(b'{"error"') else "ok")
                return body
        return await self._answer(operation, subject, data, headers, decode, handle)

    async def _answer(self, operation: str, subject: str, data: bytes, headers: dict[str, str] | None,
                      decode: Callable[[bytes], Any], handle: Handler) -> bytes:
        operation_id: str | None = None  # an invalid header id is never echoed: the reply mints one
        try:
            context = context_of(subject, headers, self.budget_seconds)
            request = decode(data)
            operation_id = context.operation_id or getattr(request, "operation_id", None)
            context = msgspec.structs.replace(context, operation_id=operation_id)
            context, decision = authorize(self.policy, context, request, operation)
            if isinstance(decision, Deny):
                DENIALS_TOTAL.labels(rule_label(decision.rule_id)).inc()
                log.info("request.denied", request=operation, rule_id=decision.rule_id)
                if self.denials is not None:
                    await self.denials.denied(context, operation, decision)  # fails closed: raises
                raise decision.error()
            if decision.delegation_id is not None:
                if self.delegations is None:
                    raise AccessDenied("requests under a delegation are not served here",
                                       rule_id="delegation.not_found")
                await self.delegations.exercise(context, operation, request, decision.delegation_id)
            return await handle(request, context)
        except Exception as exc:  # noqa: BLE001 - every failure answers with its error envelope
            return error_body(exc, operation_id, operation)


SUBSCRIPTION_REQUESTS = frozenset({"open", "poll", "ack", "resume", "close", "status", "list"})


def operation_label(operation: str) -> str:
    """A request's operation as a span name: `query.read`, `sub.open` ...; a name the service does not know
    (the subject is the client's to choose) is `query.unknown`."""
    kind, _, name = operation.partition(".")
    if kind == "query":
        return f"query.{query_label(name)}"
    if kind == "sub":
        return f"sub.{name if name in SUBSCRIPTION_REQUESTS else 'unknown'}"
    return "request"
