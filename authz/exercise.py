"""Reads, queries and searches made under a delegation: before the handler runs, the writer exercises the
delegation (a `check_delegation` sent with the service credential for the delegated actor), so the use is
checked and counted exactly as a write's is, and recorded as `delegation_exercised`.

What is checked: the operation (read, inspect_history, query), the object for a read or history, and that a
query or search, which spans the scope, is not made under a delegation restricted to some objects or object
types (`whole_scope`); a read names its object and the writer looks its type up (`strict`).
"""

from __future__ import annotations

from typing import Any

from authz.policy import REQUEST_OPERATIONS
from infra.request_shell import RequestContext
from infra.requester import CommandRequester
from schemas.errors import PamledgerError, ServiceUnavailable


class DelegatedReads:
    def __init__(self, requester: CommandRequester):
        self.requester = requester

    async def exercise(self, context: RequestContext, operation: str, request: Any, delegation_id: str) -> None:
        principal = context.principal
        object_id = getattr(request, "object_id", None)
        body: dict[str, Any] = {
            "scope_id": request.scope_id, "delegation_id": delegation_id, "delegated_actor_id": principal.actor_id,
            "operation": REQUEST_OPERATIONS[operation], "strict": True, "whole_scope": object_id is None,
            "actor": {"actor_id": principal.actor_id, "actor_kind": principal.actor_kind,
                      "delegation_id": delegation_id}}
        if object_id is not None:
            body["object_id"] = object_id
        if principal.on_behalf_of_actor_id is not None:
            body["on_behalf_of_actor_id"] = principal.on_behalf_of_actor_id
            body["actor"]["on_behalf_of_actor_id"] = principal.on_behalf_of_actor_id
        try:
            await self.requester.command("check_delegation", body)
        except PamledgerError as exc:
            if exc.code in ("access_denied", "policy_denied"):
                raise
            raise ServiceUnavailable("the delegation could not be checked: retry", details={"reason": exc.code}) from None
