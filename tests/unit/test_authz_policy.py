"""The decision function as a table: every rule, in order, with real tokens and digests (no I/O)."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import msgspec
import pytest

from authz.audit import DenialLimiter
from authz.bootstrap import ADMIN_ACTOR, SERVICE_ACTOR, bootstrap_credentials
from authz.policy import Caller, Denied, Grants, decide
from authz.registry import grants_of
from authz.tokens import BadCredential, bearer_token, new_token, token_digest
from schemas.auth import Claim
from schemas.auth import ACTOR_TYPE, CREDENTIAL_TYPE, ActorRecord, CredentialRecord, ScopeGrant, scope_matches

NOW = datetime(2026, 12, 1, tzinfo=timezone.utc)
ADMIN_ID, ADMIN = new_token()
SERVICE_ID, SERVICE = new_token()
ALICE_ID, ALICE = new_token()
OLD_ID, OLD = new_token()
ORPHAN_ID, ORPHAN = new_token()
WRITER_ID, WRITER = new_token()  # carol: create alone, no read
alice = ActorRecord(actor_id="actor:alice", actor_kind="agent", grants=[
    ScopeGrant(scopes=["team:a:*"], operations=["read", "query", "create"]),
    ScopeGrant(scopes=["team:shared"], operations=["*"])])
carol = ActorRecord(actor_id="actor:carol", actor_kind="agent", grants=[
    ScopeGrant(scopes=["team:c:*"], operations=["create"])])


def grants() -> Grants:
    base = grants_of([], 7, bootstrap_credentials(ADMIN, SERVICE))
    return Grants(credentials={**base.credentials,
                               ALICE_ID: CredentialRecord(token_id=ALICE_ID, actor_id="actor:alice",
                                                          token_digest=token_digest(ALICE)),
                               OLD_ID: CredentialRecord(token_id=OLD_ID, actor_id="actor:alice",
                                                        token_digest=token_digest(OLD),
                                                        not_after=NOW - timedelta(seconds=1)),
                               ORPHAN_ID: CredentialRecord(token_id=ORPHAN_ID, actor_id="actor:gone",
                                                           token_digest=token_digest(ORPHAN)),
                               WRITER_ID: CredentialRecord(token_id=WRITER_ID, actor_id="actor:carol",
                                                           token_digest=token_digest(WRITER))},
                  actors={**base.actors, "actor:alice": alice, "actor:carol": carol})


def bearer(token: str) -> str:
    return f"Bearer {token}"


CASES = [
    # (header, request, scope, claim) -> the rule that refuses, or None
    (None, "query.read", "team:a:1", None, "auth.missing_credential"),
    ("Basic abc", "query.read", "team:a:1", None, "auth.malformed_credential"),
    ("Bearer pam_zz", "query.read", "team:a:1", None, "auth.malformed_credential"),
    (bearer(ALICE[:-1] + ("A" if ALICE[-1] != "A" else "B")), "query.read", "team:a:1", None,
     "auth.unknown_credential"),  # right id, wrong secret: said like an unknown id
    (bearer(new_token()[1]), "query.read", "team:a:1", None, "auth.unknown_credential"),
    (bearer(OLD), "query.read", "team:a:1", None, "auth.expired_credential"),
    (bearer(ORPHAN), "query.read", "team:a:1", None, "auth.unknown_actor"),
    (bearer(ALICE), "query.explode", "team:a:1", None, "authz.unknown_operation"),
    (bearer(ALICE), "cmd.open_subscription", "team:a:1", None, "authz.internal_only"),
    (bearer(ALICE), "cmd.create", "team:a:1", Claim("actor:mallory"), "authz.actor_mismatch"),
    (bearer(ALICE), "cmd.create", "team:a:1", Claim("actor:alice", on_behalf_of_actor_id="actor:bob"),
     "delegation.not_found"),
    # a write's provenance.actor is the authenticated actor, or the principal of the delegation it is made under
    (bearer(ALICE), "cmd.create", "team:a:1", Claim("actor:alice", provenance_actor_id="actor:alice"), None),
    (bearer(ALICE), "cmd.create", "team:a:1", Claim("actor:alice", provenance_actor_id="actor:mallory"),
     "authz.provenance_actor_mismatch"),
    (bearer(ALICE), "cmd.delete", "team:shared", Claim("actor:alice", provenance_actor_id="actor:bob"),
     "authz.provenance_actor_mismatch"),
    (bearer(ALICE), "cmd.correct_provenance", "team:shared", Claim("actor:alice", provenance_actor_id="actor:bob"),
     "authz.provenance_actor_mismatch"),
    (bearer(ALICE), "cmd.create", "team:b:1", Claim("actor:alice", "actor:bob", "del:1", "actor:bob"),
     None),  # the principal: the writer checks the delegation was granted by actor:bob
    (bearer(ALICE), "cmd.create", "team:b:1", Claim("actor:alice", "actor:bob", "del:1", "actor:alice"), None),
    (bearer(ALICE), "cmd.create", "team:b:1", Claim("actor:alice", "actor:bob", "del:1", "actor:mallory"),
     "authz.provenance_actor_mismatch"),
    (bearer(ALICE), "cmd.create", "team:b:1", Claim("actor:alice", None, "del:1", "actor:bob"),
     "authz.provenance_actor_mismatch"),  # a principal is named in actor.on_behalf_of_actor_id, or not at all
    (bearer(ALICE), "cmd.create", "team:a:1", Claim("actor:alice", "actor:bob", None, "actor:bob"),
     "authz.provenance_actor_mismatch"),  # on behalf of another without a delegation: no principal
    (bearer(ADMIN), "cmd.create", "anything:else", Claim("actor:pamledger:admin", provenance_actor_id="actor:alice"),
     "authz.provenance_actor_mismatch"),  # the administrator too (restore names itself in both)
    (bearer(SERVICE), "cmd.transition", "team:a:1", Claim("actor:pamledger:retention",
                                                          provenance_actor_id="actor:pamledger:retention"), None),
    (bearer(SERVICE), "cmd.transition", "team:a:1", Claim("actor:pamledger:retention"), None),
    (bearer(SERVICE), "cmd.transition", "team:a:1", Claim("actor:pamledger:retention", provenance_actor_id="actor:alice"),
     "authz.provenance_actor_mismatch"),
    (bearer(SERVICE), "cmd.transition", "team:a:1", Claim("actor:alice", provenance_actor_id="actor:alice"),
     "authz.operation_not_granted"),  # the service acts only as the retention actor
    (bearer(ALICE), "cmd.create", "team:b:1", Claim("actor:alice", delegation_id="del:1"), None),  # writer checks it
    (bearer(ALICE), "query.read", "team:b:1", Claim("actor:alice", delegation_id="del:1"), None),  # shell exercises
    (bearer(ALICE), "sub.open", "team:b:1", Claim("actor:alice", delegation_id="del:1"), None),  # shell exercises
    (bearer(ALICE), "sub.poll", None, Claim("actor:alice", delegation_id="del:1"), None),  # the owner's follow-up
    (bearer(ALICE), "query.read", "team:b:1", None, "authz.scope_not_granted"),
    (bearer(ALICE), "query.read", "team:a", None, "authz.scope_not_granted"),  # the prefix is "team:a:"
    (bearer(ALICE), "cmd.delete", "team:a:1", Claim("actor:alice"), "authz.operation_not_granted"),
    (bearer(ALICE), "query.read", "system:pamledger", None, "authz.scope_not_granted"),
    (bearer(ALICE), "query.read", "team:a:1", None, None),
    (bearer(ALICE), "cmd.create", "team:a:1", Claim("actor:alice"), None),
    (bearer(ALICE), "cmd.delete", "team:shared", Claim("actor:alice"), None),
    (bearer(ALICE), "sub.poll", None, None, None),  # the gateway checks the subscription's owner
    (bearer(ADMIN), "query.read", "system:pamledger", None, None),
    (bearer(ADMIN), "cmd.create", "anything:else", Claim("actor:pamledger:admin"), None),
    (bearer(ADMIN), "cmd.create", "anything:else", Claim("actor:alice"), "authz.actor_mismatch"),
    (bearer(ADMIN), "cmd.open_subscription", "team:a:1", None, "authz.internal_only"),
    (bearer(SERVICE), "cmd.open_subscription", "team:a:1", Claim("actor:alice"), None),
    (bearer(SERVICE), "cmd.register_embedding_space", "system:pamledger", Claim("actor:pamledger:indexer"), None),
    (bearer(SERVICE), "query.read", "team:a:1", None, "authz.operation_not_granted"),
    # an export needs read AND inspect_history; an import, create there and administering the service
    (bearer(ALICE), "query.export", "team:a:1", None, "authz.operation_not_granted"),  # read, no inspect_history
    (bearer(ALICE), "query.export", "team:shared", None, None),
    (bearer(ALICE), "query.export", "team:b:1", None, "authz.scope_not_granted"),
    (bearer(ALICE), "cmd.import_entries", "team:shared", Claim("actor:alice"), "authz.import_needs_administrator"),
    (bearer(ALICE), "cmd.import_entries", "team:b:1", Claim("actor:alice"), "authz.scope_not_granted"),
    (bearer(ADMIN), "cmd.import_entries", "anything:else", Claim("actor:pamledger:admin"), None),
    (bearer(ADMIN), "cmd.import_entries", "anything:else", Claim("actor:alice"), "authz.actor_mismatch"),
    # sealing an evaluation snapshot pins what the caller may read: it needs read on the scope, nothing more
    (bearer(ALICE), "cmd.snapshot_create", "team:a:1", Claim("actor:alice"), None),
    (bearer(ALICE), "cmd.snapshot_create", "team:b:1", Claim("actor:alice"), "authz.scope_not_granted"),
    (bearer(ALICE), "cmd.snapshot_create", "team:a:1", Claim("actor:mallory"), "authz.actor_mismatch"),
    (bearer(ALICE), "cmd.snapshot_create", "team:b:1", Claim("actor:alice", delegation_id="del:1"),
     "delegation.not_found"),  # not made under a delegation
    (bearer(WRITER), "cmd.snapshot_create", "team:c:1", Claim("actor:carol"), "authz.operation_not_granted"),
    (bearer(WRITER), "cmd.create", "team:c:1", Claim("actor:carol"), None),
    # an evaluation run forks a snapshot of a scope the caller reads; ending it needs create on the run's scope
    (bearer(ALICE), "cmd.eval_start", "team:a:1", Claim("actor:alice"), None),
    (bearer(ALICE), "cmd.eval_start", "team:b:1", Claim("actor:alice"), "authz.scope_not_granted"),
    (bearer(WRITER), "cmd.eval_start", "team:c:1", Claim("actor:carol"), "authz.operation_not_granted"),
    (bearer(ALICE), "cmd.eval_start", "team:b:1", Claim("actor:alice", delegation_id="del:1"), "delegation.not_found"),
    (bearer(WRITER), "cmd.eval_end", "team:c:1", Claim("actor:carol"), None),
    (bearer(WRITER), "cmd.eval_end", "team:a:1", Claim("actor:carol"), "authz.scope_not_granted"),
    # status: any authenticated caller (what it sees is infra.status's: health, or all with the system scope)
    (None, "status", None, None, "auth.missing_credential"),
    (bearer(OLD), "status", None, None, "auth.expired_credential"),
    (bearer(ALICE), "status", None, None, None),
    (bearer(ALICE), "status", None, Claim("actor:mallory"), "authz.actor_mismatch"),  # a Pam-Actor header
    (bearer(ADMIN), "status", None, None, None),
    (bearer(SERVICE), "status", None, None, None),
    (bearer(ALICE), "query.snapshots", "team:a:1", None, None),
    (bearer(ALICE), "query.snapshots", "team:b:1", None, "authz.scope_not_granted"),
    (bearer(WRITER), "query.snapshots", "team:c:1", None, "authz.operation_not_granted"),
    # a snapshot diff shows versions and ledger events: read AND inspect_history, like an export
    (bearer(ALICE), "query.snapshot_diff", "team:a:1", None, "authz.operation_not_granted"),  # no inspect_history
    (bearer(ALICE), "query.snapshot_diff", "team:shared", None, None),
    (bearer(ALICE), "query.snapshot_diff", "team:b:1", None, "authz.scope_not_granted"),
    (bearer(WRITER), "query.snapshot_diff", "team:c:1", None, "authz.operation_not_granted"),
]


@pytest.mark.parametrize("header, request_kind, scope_id, claim, rule", CASES)
def test_each_rule_decides(header: str | None, request_kind: str, scope_id: str | None, claim: Claim | None,
                           rule: str | None) -> None:
    outcome = decide(grants(), header, request_kind, scope_id, claim, NOW)
    if rule is None:
        assert isinstance(outcome, Caller), outcome
    else:
        assert isinstance(outcome, Denied) and outcome.rule_id == rule, outcome


def test_a_denial_after_authentication_names_the_caller() -> None:
    outcome = decide(grants(), bearer(ALICE), "query.read", "team:b", None, NOW)
    assert isinstance(outcome, Denied) and outcome.caller is not None
    assert (outcome.caller.actor_id, outcome.caller.token_id) == ("actor:alice", ALICE_ID)


@pytest.mark.parametrize("pattern, scope_id, matches", [
    ("*", "team:a", True), ("*", "system:pamledger", False), ("system:pamledger", "system:pamledger", True),
    ("system:*", "system:pamledger", False), ("team:a", "team:a", True), ("team:a", "team:ab", False),
    ("team:*", "team:ab", True), ("team:*", "tea", False)])
def test_scope_patterns(pattern: str, scope_id: str, matches: bool) -> None:
    assert scope_matches(pattern, scope_id) is matches


def test_scope_patterns_refuse_a_star_inside() -> None:
    with pytest.raises(msgspec.ValidationError):
        msgspec.convert({"scopes": ["te*am"], "operations": ["read"]}, ScopeGrant)
    with pytest.raises(msgspec.ValidationError):
        msgspec.convert({"scopes": ["team"], "operations": ["obliterate"]}, ScopeGrant)


def test_bearer_header_shapes() -> None:
    assert bearer_token(bearer(ALICE)) == ALICE
    for header, rule in [(None, "auth.missing_credential"), ("", "auth.missing_credential"),
                         ("Bearer " + "x" * 300, "auth.malformed_credential"),
                         ("Bearer pam_" + "g" * 16 + "_" + "a" * 43, "auth.malformed_credential"),
                         ("bearer " + ALICE, "auth.malformed_credential")]:
        with pytest.raises(BadCredential) as err:
            bearer_token(header)
        assert err.value.rule_id == rule


def _row(object_id: str, object_type: str, content: object, availability: str = "available",
         lifecycle: str = "active") -> tuple[str, bytes, bytes | None]:
    meta = {"object_type": object_type, "availability_state": availability, "lifecycle_state": lifecycle}
    return object_id, msgspec.json.encode(meta), msgspec.json.encode(content) if content is not None else None


def test_the_snapshot_keeps_live_records_only() -> None:
    bob_id, bob_token = new_token()
    carol_id, _ = new_token()
    service_like_id, service_like = new_token()
    rows = [
        _row("actor:bob", ACTOR_TYPE, {"actor_id": "actor:bob", "actor_kind": "agent"}),
        _row(f"credential:{bob_id}", CREDENTIAL_TYPE,
             {"token_id": bob_id, "actor_id": "actor:bob", "token_digest": token_digest(bob_token)}),
        _row(f"credential:{carol_id}", CREDENTIAL_TYPE, None, availability="deleted"),  # revoked
        _row("actor:dave", ACTOR_TYPE, {"actor_id": "actor:dave", "actor_kind": "agent"}, lifecycle="archived"),
        _row("actor:eve", ACTOR_TYPE, {"actor_id": "actor:mallory", "actor_kind": "agent"}),  # id mismatch
        _row("actor:pamledger:admin", ACTOR_TYPE, {"actor_id": "actor:pamledger:admin", "actor_kind": "agent"}),
        _row(f"credential:{carol_id}x", CREDENTIAL_TYPE, None),
        _row(f"credential:{service_like_id}", CREDENTIAL_TYPE,  # a ledger token for the service's own actor
             {"token_id": service_like_id, "actor_id": "actor:pamledger:service",
              "token_digest": token_digest(service_like)}),
    ]
    snapshot = grants_of(rows, 42, bootstrap_credentials(ADMIN, SERVICE))
    assert set(snapshot.actors) == {"actor:bob", ADMIN_ACTOR.actor_id, SERVICE_ACTOR.actor_id}
    assert snapshot.actors[ADMIN_ACTOR.actor_id] == ADMIN_ACTOR  # a ledger record never replaces a bootstrap one
    assert set(snapshot.credentials) == {bob_id, ADMIN_ID, SERVICE_ID}
    assert snapshot.through_sequence == 42


def test_the_limiter_records_a_burst_then_one_per_interval_and_counts_the_rest() -> None:
    limiter = DenialLimiter(burst=3, every_seconds=1.0)
    key = ("actor:alice", "authz.scope_not_granted")
    assert [limiter.admit(key, now=0.0) for _ in range(5)] == [0, 0, 0, None, None]
    assert limiter.admit(key, now=0.5) is None
    assert limiter.admit(key, now=1.0) == 3  # one more allowed; three were left out before it
    assert limiter.admit(("actor:bob", "x"), now=1.0) == 0  # another caller has its own budget


def test_the_limiter_forgets_the_oldest_callers_beyond_its_bound() -> None:
    limiter = DenialLimiter(burst=1, every_seconds=100.0, max_keys=2)
    for name in ("a", "b", "c"):
        assert limiter.admit((name, "r"), now=0.0) == 0
    assert limiter.admit(("a", "r"), now=0.0) == 0  # "a" was forgotten: a fresh budget, bounded memory


def test_status_answers_health_to_an_agent_and_everything_to_the_administrator() -> None:
    import asyncio

    from authz.enforce import TokenPolicy
    from authz.registry import GrantsRegistry
    from infra.request_shell import AllowAll
    from infra.status import status_reply
    from schemas.auth import AUTHORIZATION_HEADER
    from schemas.canonical import decode_json

    async def registry() -> GrantsRegistry:  # asyncio.Event needs a loop on older Pythons
        made = GrantsRegistry("postgresql://unused", bootstrap_credentials(ADMIN, SERVICE))
        made.grants = grants()
        made.loaded.set()
        made.refreshed_at = float("inf")  # never stale
        return made

    policy = TokenPolicy(asyncio.run(registry()))
    health = {"role": "writer", "leader": True, "ok": True}

    def ask(token: str | None, policy: object = policy) -> dict[str, object]:
        headers = {AUTHORIZATION_HEADER: bearer(token)} if token is not None else None
        return decode_json(status_reply(policy, "p.status.writer", headers, health,  # type: ignore[arg-type]
                                        lambda: {"pid": 42, "ledger_sequence": 7}))

    assert ask(None)["error"]["policy_rule_id"] == "auth.missing_credential"  # type: ignore[index]
    assert ask(ALICE) == {"result": health}
    assert ask(WRITER) == {"result": health}
    assert ask(ADMIN) == {"result": {**health, "pid": 42, "ledger_sequence": 7}}
    assert ask(None, AllowAll()) == {"result": {**health, "pid": 42, "ledger_sequence": 7}}  # auth off
