"""PAMSPEC-Delegation from the SDK: grant, check (a counted use) and revoke (docs/protocol.md "Delegation").

`actor` is who sends the command: the granting actor itself (for grant and revoke), the delegated actor (for
check), or an administrator for either. It defaults to the client's own actor.
"""

from __future__ import annotations

from typing import Any


def _actor(client: Any, actor: dict[str, Any] | None) -> dict[str, Any]:
    chosen = actor or client.actor
    if not chosen:
        raise ValueError("name the actor sending the command (actor=...) or give the client one")
    return dict(chosen)


async def grant_delegation(client: Any, scope_id: str, granting_actor: dict[str, Any], delegated_actor: dict[str, Any],
                           granted_operations: list[str], policy_basis: str, not_before: str, not_after: str,
                           actor: dict[str, Any] | None = None, **optional: Any) -> dict[str, Any]:
    """Record a delegation; `optional`: delegation_id, usage_limit, granted_object_ids, granted_object_types,
    target_scope_id, revocable. Returns {delegation_id, delegation (the Delegation Object), ledger_sequence}."""
    body = {"scope_id": scope_id, "granting_actor": granting_actor, "delegated_actor": delegated_actor,
            "granted_operations": granted_operations, "policy_basis": policy_basis, "not_before": not_before,
            "not_after": not_after, "actor": _actor(client, actor or granting_actor),
            **{k: v for k, v in optional.items() if v is not None}}
    return await client.command("grant_delegation", body)  # type: ignore[no-any-return]


async def check_delegation(client: Any, delegation_id: str, scope_id: str, delegated_actor_id: str, operation: str,
                           object_id: str | None = None, object_type: str | None = None,
                           actor: dict[str, Any] | None = None) -> dict[str, Any]:
    """Exercise the delegation once for `operation`: {delegation, uses, uses_left} or PamspecError access_denied."""
    body: dict[str, Any] = {"scope_id": scope_id, "delegation_id": delegation_id,
                            "delegated_actor_id": delegated_actor_id, "operation": operation,
                            "actor": _actor(client, actor)}
    for name, value in (("object_id", object_id), ("object_type", object_type)):
        if value is not None:
            body[name] = value
    return await client.command("check_delegation", body)  # type: ignore[no-any-return]


async def revoke_delegation(client: Any, scope_id: str, delegation_id: str, actor: dict[str, Any] | None = None,
                            reason: str = "revoked") -> dict[str, Any]:
    body = {"scope_id": scope_id, "delegation_id": delegation_id, "actor": _actor(client, actor), "reason": reason}
    return await client.command("revoke_delegation", body)  # type: ignore[no-any-return]
