"""The operator commands that read Postgres themselves (verify, stream, replay, audit, spaces, index, the
subscriptions listing) go through the same decisions as the service's requests, where auth is enforced.

They run where the state dir and the database credentials are; the database credentials remain the real
boundary (anyone holding them can read the tables without this tool). What this adds: the tool asks for the
caller's token (PAMLEDGER_TOKEN, else the state dir's admin.token), authenticates it against the grants of
the ledger (authz.policy, the same snapshot the service reads) and refuses what the actor does not
hold: `audit --scope S` needs `inspect_history` on S; the rest administer the whole service (a grant on the
system scope). A refusal is answered with the access_denied envelope; it is not recorded in the ledger (the
tool has no writer of its own; docs/security.md).
"""

from __future__ import annotations

from datetime import datetime, timezone

from authz.bootstrap import admin_token_path, bootstrap_from, read_token
from authz.policy import Denied, authenticate, holds
from authz.registry import GrantsRegistry
from infra.settings import Settings
from schemas.common import SYSTEM_SCOPE
from schemas.errors import AccessDenied


async def require_operator(settings: Settings, database_url: str, scope_id: str | None = None) -> None:
    """Return when the caller may run the operator command (`scope_id`: an audit of that scope only)."""
    if settings.auth.mode == "off":
        return
    token = settings.token or read_token(admin_token_path(settings))
    grants = await GrantsRegistry.read_once(database_url, bootstrap_from(settings))
    caller = authenticate(grants, f"Bearer {token}" if token else None, datetime.now(timezone.utc))
    if isinstance(caller, Denied):
        raise AccessDenied(f"{caller.message} (set PAMLEDGER_TOKEN, or run where the state dir holds admin.token)",
                           rule_id=caller.rule_id)
    scope, operation = (scope_id, "inspect_history") if scope_id is not None else (SYSTEM_SCOPE, "create")
    rule = holds(caller.actor, scope, operation)
    if rule is not None:
        what = f"inspect_history on {scope_id}" if scope_id is not None else "a grant on the system scope"
        raise AccessDenied(f"this operator command needs {what}", rule_id=rule)
