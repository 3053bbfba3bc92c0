"""Managing who may call: actors with grants and their tokens, as objects of the system scope (schemas.auth).

Every function takes a MemoryClient holding an administrative credential (one with grants on the system
scope, such as the token `make run` writes) and writes through the ordinary create / update / delete
commands, so each change is a versioned, audited ledger entry. A token is made here, on the client: the
service only ever receives its digest, and the token is returned once, to be handed to its agent.
"""

from __future__ import annotations

import asyncio
import re
from datetime import datetime, timezone
from typing import Any, TypedDict

from pamledger_client.connection import open_nats
from pamledger_client.errors import PamspecError
from pamledger_client.protocol.tokens import new_token, password_hash, token_digest
from pamledger_client.protocol.vocabulary import (
    ACTOR_SCHEMA_ID,
    ACTOR_TYPE,
    ADMIN_ACTOR_ID,
    CREDENTIAL_SCHEMA_ID,
    CREDENTIAL_TYPE,
    GRANT_OPERATIONS,
    GRANT_SCOPE_PATTERN,
    SYSTEM_SCOPE,
    credential_object_id,
)

_SCOPE = re.compile(GRANT_SCOPE_PATTERN)
REFRESH_SECONDS = 0.5  # infra.settings.AuthSettings.refresh_seconds' default

ADMIN = {"actor_id": ADMIN_ACTOR_ID, "actor_kind": "operator"}


def _provenance(activity: str, admin: dict[str, Any]) -> dict[str, Any]:
    return {"provenance_id": f"prov:admin:{activity}", "actor": admin, "activity": activity}


class Grant(TypedDict):
    """`operations` on every scope one of `scopes` matches: exact ids, prefixes ending in `*`, or `*`."""

    scopes: list[str]
    operations: list[str]


def parse_grant(text: str) -> Grant:
    """`SCOPE[,SCOPE...]=OP[,OP...]` (e.g. `team:a:*=read,query`) as a grant; ValueError when malformed. The
    service checks the scope patterns and operation names when the actor is written (`invalid_object`)."""
    scopes, sep, operations = text.partition("=")
    if not sep:
        raise ValueError(f"a grant is SCOPES=OPERATIONS, got {text!r}")
    grant = Grant(scopes=scopes.split(","), operations=operations.split(","))
    unknown = [op for op in grant["operations"] if op not in GRANT_OPERATIONS]
    if unknown:
        raise ValueError(f"bad grant {text!r}: unknown operation {unknown[0]!r}"
                         f" (one of {', '.join(sorted(GRANT_OPERATIONS))})")
    bad = [scope for scope in grant["scopes"] if not scope or len(scope) > 512 or not _SCOPE.match(scope)]
    if bad:
        raise ValueError(f"bad grant {text!r}: scope {bad[0]!r} is not an id, a prefix ending in '*', or '*'")
    return grant


async def _current(client: Any, object_id: str) -> dict[str, Any] | None:
    try:
        return await client.read(SYSTEM_SCOPE, object_id)  # type: ignore[no-any-return]
    except PamspecError as exc:
        if exc.code in ("object_not_found", "object_deleted"):
            return None
        raise


async def put_actor(client: Any, actor_id: str, actor_kind: str, grants: list[Grant],
                    display_name: str | None = None, admin: dict[str, Any] = ADMIN) -> dict[str, Any]:
    """Register `actor_id` with exactly `grants` (a new version when it exists: the grants are replaced)."""
    content: dict[str, Any] = {"actor_id": actor_id, "actor_kind": actor_kind,
                               "grants": [{"scopes": list(g["scopes"]), "operations": list(g["operations"])}
                                          for g in grants]}
    if display_name is not None:
        content["display_name"] = display_name
    current = await _current(client, actor_id)
    if current is None:
        result = await client.create(SYSTEM_SCOPE, ACTOR_TYPE, content, admin, _provenance("actor_registered", admin),
                                     object_id=actor_id, schema_id=ACTOR_SCHEMA_ID)
        return {"actor_id": actor_id, "created": True, "version_id": result["version_id"]}
    result = await client.update(SYSTEM_SCOPE, actor_id, current["version_id"], content, admin,
                                 _provenance("actor_grants_changed", admin))
    return {"actor_id": actor_id, "created": False, "version_id": result["version_id"]}


async def issue_token(client: Any, actor_id: str, not_after: str | None = None, label: str | None = None,
                      admin: dict[str, Any] = ADMIN, wait_seconds: float = 10.0) -> dict[str, Any]:
    """A new token for a registered actor: {token (shown only now), token_id, actor_id, ...}. Returns once the
    service accepts it (each process picks new credentials up within half a second; up to `wait_seconds`),
    so the token works at once; 0 returns at once."""
    if await _current(client, actor_id) is None:
        raise PamspecError.of("invalid_request", "no such actor is registered: add it first",
                              {"actor_id": actor_id})
    expires = _not_after(not_after)  # refuse a bad not_after here, before anything is sent
    token_id, token = new_token()
    content: dict[str, Any] = {"token_id": token_id, "actor_id": actor_id, "token_digest": token_digest(token),
                               "nats_password_hash": _nats_password_hash(token)}  # its NATS login (docs/security.md)
    if not_after is not None:
        content["not_after"] = not_after
    if label is not None:
        content["label"] = label
    result = await client.create(SYSTEM_SCOPE, CREDENTIAL_TYPE, content, admin, _provenance("token_issued", admin),
                                 object_id=credential_object_id(token_id), schema_id=CREDENTIAL_SCHEMA_ID)
    if wait_seconds > 0 and (expires is None or expires > datetime.now(timezone.utc)):
        await _until_accepted(client, token, wait_seconds)
    return {"token": token, "token_id": token_id, "actor_id": actor_id, "not_after": not_after,
            "version_id": result["version_id"]}


def _not_after(text: str | None) -> datetime | None:
    """The expiry an RFC 3339 `not_after` names (with its offset); invalid_request when it is not one."""
    if text is None:
        return None
    try:
        moment: datetime | None = datetime.fromisoformat(text.replace("Z", "+00:00").replace("z", "+00:00"))
    except ValueError:
        moment = None
    if moment is None or moment.tzinfo is None:
        raise PamspecError.of("invalid_request", "not_after is not an RFC 3339 timestamp with an offset"
                              " (e.g. 2027-01-01T00:00:00Z)", {"field": "not_after"})
    return moment


def _nats_password_hash(token: str) -> str:
    try:
        return password_hash(token)
    except ImportError:
        raise PamspecError.of("invalid_request", "issuing a token needs bcrypt (its NATS login is stored as a"
                              " bcrypt hash): pip install 'pamledger-client[admin]'") from None


async def _until_accepted(client: Any, token: str, wait_seconds: float) -> None:
    """Until the query service accepts `token`, then one refresh interval more, so that the writer and the
    gateway (which refresh on their own, every 0.5 s) have it too. Where auth is off it returns at once."""
    deadline = asyncio.get_running_loop().time() + wait_seconds
    while asyncio.get_running_loop().time() < deadline:
        try:
            found = await client.whoami(token)
        except PamspecError as exc:
            if exc.code != "access_denied":
                raise
        else:
            if found.get("authenticated"):
                await asyncio.sleep(REFRESH_SECONDS)
                await _until_nats_login(client, token, deadline)
            return
        await asyncio.sleep(0.1)


async def _until_nats_login(client: Any, token: str, deadline: float) -> None:
    """Where pamledger runs NATS with users (auth enforced), a new token's NATS login appears once the
    server has reloaded its users (about a second): wait for it too, so the token works at once."""
    url = getattr(client.nc, "connected_url", None)
    if url is None:
        return
    address = f"{url.scheme}://{url.hostname}:{url.port}"
    while True:
        try:
            nc = await open_nats(address, 2.0, token=token)
        except PamspecError as exc:
            if exc.code != "access_denied" or asyncio.get_running_loop().time() >= deadline:
                return  # not a login problem, or out of time: the caller finds out when it connects
            await asyncio.sleep(0.2)
            continue
        await nc.close()
        return


async def _delete(client: Any, object_id: str, what: str, admin: dict[str, Any]) -> dict[str, Any]:
    current = await _current(client, object_id)
    if current is None:
        raise PamspecError.of("object_not_found", f"no such {what}", {"object_id": object_id})
    result = await client.delete(SYSTEM_SCOPE, object_id, current["version_id"], admin,
                                 _provenance(f"{what}_revoked", admin))
    return {"object_id": object_id, "revoked": True, "ledger_sequence": result["ledger_sequence"]}


async def revoke_token(client: Any, token_id: str, admin: dict[str, Any] = ADMIN) -> dict[str, Any]:
    """Delete the credential: its digest is erased and the next request with the token is refused."""
    return await _delete(client, credential_object_id(token_id), "token", admin)


async def revoke_actor(client: Any, actor_id: str, admin: dict[str, Any] = ADMIN) -> dict[str, Any]:
    """Delete the actor record: every token of the actor stops working, its subscriptions are closed."""
    return await _delete(client, actor_id, "actor", admin)


async def list_records(client: Any, object_type: str) -> list[dict[str, Any]]:
    """The live actor (or credential) records, digests left out. Read from the projection (Query), so a
    record written a moment ago may show a moment later; the policy itself reads authoritative state."""
    items: list[dict[str, Any]] = []
    cursor = None
    while True:
        page = await client.query(SYSTEM_SCOPE, object_types=[object_type], limit=100,
                                  validation_states=["unverified", "corroborated", "disputed", "rejected"],
                                  retention_states=["retained", "expired", "pending_deletion", "legal_hold"],
                                  **({"cursor": cursor} if cursor else {}))
        for item in page.get("items", []):
            envelope = item.get("envelope") or {}
            content = dict(envelope.get("canonical_content") or {})
            content.pop("token_digest", None)
            content.pop("nats_password_hash", None)
            items.append({**content, "version_id": envelope.get("version_id")})
        cursor = page.get("next_cursor")
        if not cursor:
            return items
