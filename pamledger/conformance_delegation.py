"""The conformance adapter's PAMSPEC-Delegation operations: grant_delegation, check_delegation, revoke_delegation.

The adapter runs with an administrative credential (the state dir's admin.token, or PAMLEDGER_TOKEN), so it
records grants and checks as that administrator; the writer still checks every delegation rule. It sets up
what the upstream suite presumes: the scope exists, and the granting actor holds the operations it grants
(registered, or its grants extended, on that scope). Revoke takes only an id, so the adapter remembers the
scope of each delegation it granted.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

from pamledger_client.admin import ADMIN, Grant, _current, put_actor
from pamledger_client.client import MemoryClient, PamspecError
from pamledger_client.delegation import check_delegation, grant_delegation, revoke_delegation


class DelegationOperations:
    def __init__(self) -> None:
        self.scopes: dict[str, str] = {}  # delegation_id -> scope_id, for revoke

    async def call(self, client: MemoryClient, operation: str, arguments: dict[str, Any],
                   ensure_scope: Callable[[MemoryClient, str], Awaitable[None]]) -> Any:
        if operation == "revoke_delegation":
            scope_id = self.scopes.get(arguments["delegation_id"])
            if scope_id is None:
                raise PamspecError("access_denied", "no delegation with this id was granted here", False,
                                   {"delegation_id": arguments["delegation_id"]})
            await revoke_delegation(client, scope_id, arguments["delegation_id"], actor=ADMIN)
            return {}
        await ensure_scope(client, arguments["scope_id"])
        if operation == "check_delegation":
            checked = await check_delegation(client, arguments["delegation_id"], arguments["scope_id"],
                                             arguments["delegated_actor_id"], arguments["operation"],
                                             object_id=arguments.get("object_id"), actor=ADMIN)
            return checked["delegation"]
        return await self._grant(client, arguments)

    async def _grant(self, client: MemoryClient, arguments: dict[str, Any]) -> Any:
        optional = {k: arguments[k] for k in ("usage_limit", "granted_object_ids", "granted_object_types")
                    if arguments.get(k) is not None}
        def call() -> Awaitable[dict[str, Any]]:
            return grant_delegation(
                client, arguments["scope_id"], arguments["granting_actor"], arguments["delegated_actor"],
                arguments["granted_operations"], arguments["policy_basis"], arguments["not_before"],
                arguments["not_after"], actor=ADMIN, **optional)
        try:
            granted = await call()
        except PamspecError as exc:
            if exc.policy_rule_id != "delegation.grantor_lacks_operation":
                raise
            await self._let_hold(client, arguments)
            granted = await self._retry(call)
        self.scopes[granted["delegation_id"]] = arguments["scope_id"]
        return {"delegation_id": granted["delegation_id"], **granted["delegation"]}

    async def _let_hold(self, client: MemoryClient, arguments: dict[str, Any]) -> None:
        """Give the granting actor the granted operations on the scope (keeping what it holds already)."""
        actor = arguments["granting_actor"]
        current = await _current(client, actor["actor_id"])
        grants = [Grant(scopes=list(g["scopes"]), operations=list(g["operations"]))
                  for g in (current or {}).get("canonical_content", {}).get("grants", [])]
        grants.append(Grant(scopes=[arguments["scope_id"]], operations=list(arguments["granted_operations"])))
        await put_actor(client, actor["actor_id"], actor.get("actor_kind", "agent"), grants)

    @staticmethod
    async def _retry(call: Callable[[], Awaitable[dict[str, Any]]]) -> dict[str, Any]:
        """The writer sees the new grants within its refresh interval (0.5 s): retry for up to 5 s."""
        for _ in range(50):
            try:
                return await call()
            except PamspecError as exc:
                if exc.policy_rule_id != "delegation.grantor_lacks_operation":
                    raise
            await asyncio.sleep(0.1)
        return await call()
