"""Evaluation runs with their credential: `eval_start` plus an actor and token that may write in the run's
scope only, and `eval_end` plus that actor's revocation (docs/protocol.md, "Evaluation runs").

The credential is made here, by an administrative client (like `pamledger tokens issue`: the token is born on
the client and only its digest reaches the service), and only where auth is enforced (the caller is
authenticated); with auth off there are no credentials to hand out and the run has none. Its actor
`actor:evaluation:<run id>` holds every operation on the evaluation scope and read, query and inspect_history
on the snapshot's scope: a write anywhere else is access_denied, recorded like every denial.
"""

from __future__ import annotations

from typing import Any

from pamledger_client.admin import Grant, issue_token, put_actor, revoke_actor
from pamledger_client.errors import PamspecError

RUN_OPERATIONS = ["create", "read", "update", "transition", "relate", "query", "inspect_history", "redact",
                  "delete", "promote", "subscribe", "unsubscribe"]
BASE_OPERATIONS = ["read", "query", "inspect_history"]


def evaluation_actor_id(run_id: str) -> str:
    return f"actor:evaluation:{run_id}"


def run_grants(run: dict[str, Any]) -> list[Grant]:
    """What an evaluation credential holds: everything on its scope, reads on the snapshot's."""
    return [Grant(scopes=[run["scope_id"]], operations=list(RUN_OPERATIONS)),
            Grant(scopes=[run["base_scope_id"]], operations=list(BASE_OPERATIONS))]


async def start_run(client: Any, scope_id: str, snapshot_id: str, actor: dict[str, Any],
                    evaluation_scope_id: str | None = None, evaluation_run_id: str | None = None) -> dict[str, Any]:
    """Open the run; where the caller is authenticated (auth enforced), also its credential: the result's
    `credential` {actor_id, token, token_id} (the token shown only now)."""
    started = await client.eval_start(scope_id, snapshot_id, actor, evaluation_scope_id, evaluation_run_id)
    run = started["evaluation_run"]
    if not (await client.whoami()).get("authenticated"):
        return {**started, "credential": None}
    actor_id = evaluation_actor_id(run["run_id"])
    await put_actor(client, actor_id, "agent", run_grants(run), display_name=f"evaluation run {run['run_id']}")
    issued = await issue_token(client, actor_id, label=f"evaluation run {run['run_id']}")
    return {**started, "credential": {"actor_id": actor_id, "token": issued["token"], "token_id": issued["token_id"]}}


async def end_run(client: Any, evaluation_scope_id: str, actor: dict[str, Any]) -> dict[str, Any]:
    """Close the run, then revoke its credential's actor (every token of it stops working) where it has one."""
    ended = await client.eval_end(evaluation_scope_id, actor)
    revoked = None
    try:
        revoked = await revoke_actor(client, evaluation_actor_id(ended["evaluation_run"]["run_id"]))
    except PamspecError as exc:
        if exc.code != "object_not_found":  # no credential was made (auth off)
            raise
    return {**ended, "credential_revoked": revoked is not None}
