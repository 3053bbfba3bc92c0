"""The NATS users pamledger renders (authz/nats_auth.py, authz/nats_users_sync.py): who is a user, with what
permissions, and that processes writing one file agree on it (no reload ping-pong)."""

from __future__ import annotations

import json
import re
from datetime import datetime, timedelta, timezone
from pathlib import Path

from authz.bootstrap import bootstrap_credentials
from authz.policy import Grants
from authz.tokens import new_token, token_digest
from authz.nats_auth import SERVICE_USER, agent_permissions, hash_matches, password_hash
from authz.nats_users_sync import NatsUsers
from schemas.auth import ActorRecord, CredentialRecord

NOW = datetime(2026, 12, 1, tzinfo=timezone.utc)


def _users(text: str) -> dict[str, dict[str, object]]:
    return {u["user"]: u for u in json.loads(text)["authorization"]["users"]}


def test_an_agent_publishes_only_requests_and_receives_only_on_its_inbox() -> None:
    permissions = agent_permissions("pam", "0123456789abcdef")
    assert permissions["subscribe"] == {"allow": ["_INBOX.0123456789abcdef.>"]}
    allowed = permissions["publish"]["allow"]
    assert "pam.cmd.create" in allowed and "pam.query.*" in allowed and "pam.sub.open" in allowed
    assert not any(s.startswith(("$JS", "_INBOX", "pam.ledger")) or s in ("pam.cmd.*", ">", "pam.>") for s in allowed)
    assert "pam.cmd.open_subscription" not in allowed and "pam.sub.deliver.*" not in allowed
    # The gateway routes to `pam.sub.p<partition>.<call>` (subscriptions.routing): the service's own subjects.
    assert not any(re.match(r"pam\.sub\.p\d", s) or s in ("pam.sub.*", "pam.sub.>") for s in allowed)


def test_live_credentials_with_a_hash_are_users_and_others_are_not(tmp_path: Path) -> None:
    admin = new_token()[1]
    service = new_token()[1]
    actor = ActorRecord(actor_id="actor:agent:a", actor_kind="agent")
    records = {}
    for name, not_after, actor_id, hashed in (("live", None, actor.actor_id, True),
                                               ("expired", NOW - timedelta(seconds=1), actor.actor_id, True),
                                               ("orphan", None, "actor:agent:gone", True),
                                               ("old", None, actor.actor_id, False)):
        token_id, token = new_token()
        records[name] = (token_id, CredentialRecord(
            token_id=token_id, actor_id=actor_id, token_digest=token_digest(token), not_after=not_after,
            nats_password_hash=password_hash(token) if hashed else None))
    bootstrap = bootstrap_credentials(admin, service)
    grants = Grants(credentials={**{c.token_id: c for c, _ in bootstrap}, **{t: r for t, r in records.values()}},
                    actors={**{a.actor_id: a for _, a in bootstrap}, actor.actor_id: actor})
    users = NatsUsers(tmp_path, "pam", "service-secret", admin)
    named = _users(users.desired(grants, NOW))
    assert set(named) == {SERVICE_USER, admin[4:20], records["live"][0]}
    assert hash_matches(str(named[admin[4:20]]["password"]), admin)
    assert hash_matches(str(named[SERVICE_USER]["password"]), "service-secret")


def test_two_processes_writing_one_file_agree_after_one_write(tmp_path: Path) -> None:
    admin = new_token()[1]
    first, second = (NatsUsers(tmp_path, "pam", "secret", admin) for _ in range(2))
    assert first.apply(first.desired(None))
    assert not second.apply(second.desired(None))  # adopts the salts on disk: nothing to rewrite
    # a third writer's salts (another process started from nothing): both adopt them, nobody rewrites again
    assert second.apply(NatsUsers(tmp_path / "elsewhere", "pam", "secret", admin).desired(None))
    assert not first.apply(first.desired(None)) and not second.apply(second.desired(None))


def test_auth_off_renders_no_users(tmp_path: Path) -> None:
    assert "authorization" not in json.loads(NatsUsers(tmp_path, "pam", None, None).desired(None))


def test_every_agent_command_is_publishable_by_a_credential_login() -> None:
    """A command the writer knows that is not the service's own must be in pamledger_client.protocol.subjects.COMMANDS, else a
    credential's NATS login cannot publish it where pamledger runs NATS with users (the [M5] commands were
    missing once)."""
    from authz.policy import SERVICE_REQUESTS
    from pamledger_client.protocol.subjects import COMMANDS
    from schemas.commands import COMMAND_TYPES

    service_only = {name for name in COMMAND_TYPES if f"cmd.{name}" in SERVICE_REQUESTS} - {"check_delegation"}
    assert set(COMMANDS) == set(COMMAND_TYPES) - service_only


def test_a_credential_may_send_every_request_the_gateway_answers() -> None:
    """The gateway's requests and the NATS permission list come from one tuple: a new call (`sub.list`) cannot
    be answered yet unreachable through the locked transport."""
    from pamledger_client.protocol.subjects import SUBSCRIPTION_CALLS
    from subscriptions.requests import DECODERS

    assert set(DECODERS) == set(SUBSCRIPTION_CALLS)
    allowed = set(agent_permissions("pam", "tok:x")["publish"]["allow"])
    assert {f"pam.sub.{call}" for call in SUBSCRIPTION_CALLS} <= allowed
