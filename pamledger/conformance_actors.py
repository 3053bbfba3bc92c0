"""The conformance adapter's stand-ins for the harness's actors, where auth is enforced.

The harness names an actor in every write and subscription (`actor:agent:...`) and expects the operation to
be performed as that actor; the service refuses a command whose actor is not the caller. So the adapter,
holding an administrative credential, registers each actor it meets once, with every operation on every
scope (`*`, which never covers the system scope), issues it a token, and sends that actor's operations with
it. Scopes still separate the actors' objects: a reference to another scope answers object_not_found whatever
the grants. The grants are real ledger entries in
the system scope: run the harness against a service kept for it.
"""

from __future__ import annotations

import asyncio
from typing import Any

from pamledger_client.admin import issue_token, parse_grant, put_actor
from pamledger_client.client import MemoryClient, PamspecError


class ActorClients:
    def __init__(self, admin: MemoryClient):
        self.admin = admin
        self.clients: dict[str, MemoryClient] = {}

    async def client_for(self, actor: Any, scope_id: str) -> MemoryClient:
        if not isinstance(actor, dict) or not isinstance(actor.get("actor_id"), str):
            return self.admin  # the service answers a malformed actor itself
        actor_id = actor["actor_id"]
        client = self.clients.get(actor_id)
        if client is None:
            await put_actor(self.admin, actor_id, str(actor.get("actor_kind") or "agent"), [parse_grant("*=*")])
            issued = await issue_token(self.admin, actor_id, label="conformance adapter")
            client = await MemoryClient.connect(None, self.admin.prefix, self.admin.timeout, token=issued["token"])
            client.retries = 0
            self.clients[actor_id] = client
            await _until_granted(client, scope_id)
        return client

    async def close(self) -> None:
        for client in self.clients.values():
            await client.close()


async def _until_granted(client: MemoryClient, scope_id: str) -> None:
    """Every process sees new grants within its refresh interval (0.5 s): wait up to 5 s for this one."""
    for _ in range(50):
        try:
            await client.query(scope_id, limit=1)
            return
        except PamspecError as exc:
            if exc.code != "access_denied":
                return
        await asyncio.sleep(0.1)
