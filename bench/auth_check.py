"""`python -m bench auth_check`: where the writer's per-command authorization time goes, in-process.

The end-to-end pairs (bench.auth) are noisy on a shared 2-core machine; this times the exact code the
writer runs per create (command_handler.writer: `parse`, then `denials.admit`), with auth off (AllowAll)
and enforced (TokenPolicy over a grants snapshot of 1,000 actors and credentials), and its parts: the
header parse of nats-py with and without the Authorization header, the token's sha256 + constant-time
compare, the regexes, the pure decision, the clock. Best of 5 repeats of N calls each, microseconds per
call; the baseline of the same run is the writer's `parse` of the same create (the work every create pays).
"""

from __future__ import annotations

import argparse
import time
import timeit
from datetime import datetime, timezone
from typing import Any

from authz.audit import DenialLimiter
from authz.enforce import TokenPolicy
from authz.policy import authenticate, decide
from authz.registry import GrantsRegistry, grants_of
from authz.tokens import bearer_token, digest_matches, new_token, token_digest, token_id_of
from bench.load import ACTOR, create_payload
from command_handler.denials import admit
from command_handler.core.intake import parse
from infra.request_shell import AllowAll, context_of
from schemas.auth import Claim
from schemas.auth import AUTHORIZATION_HEADER, ActorRecord, CredentialRecord, ScopeGrant

SUBJECT = "bench.cmd.create"


def _snapshot(actors: int, token: str, token_id: str) -> Any:
    """A grants snapshot with `actors` agents (one credential each) plus the bench actor and its token."""
    bootstrap: list[tuple[CredentialRecord, ActorRecord]] = []
    for i in range(actors):
        tid, tok = new_token()
        bootstrap.append((CredentialRecord(token_id=tid, actor_id=f"actor:agent:{i}", token_digest=token_digest(tok)),
                          ActorRecord(actor_id=f"actor:agent:{i}", actor_kind="agent",
                                      grants=[ScopeGrant(scopes=[f"team:{i}:*"], operations=["*"])])))
    bootstrap.append((CredentialRecord(token_id=token_id, actor_id=ACTOR["actor_id"], token_digest=token_digest(token)),
                      ActorRecord(actor_id=ACTOR["actor_id"], actor_kind="agent",
                                  grants=[ScopeGrant(scopes=["scope:bench"], operations=["create"])])))
    return grants_of([], 1, bootstrap)


def _nats_headers(raw: bytes) -> Any:
    """nats-py's header-block parser (what the client runs on every received message with headers)."""
    from nats.aio.client import Client

    return lambda: Client._parse_header_lines(raw)  # noqa: SLF001 - the parser nats-py uses per message


def _raw_headers(headers: dict[str, str]) -> bytes:
    return ("".join(f"{k}: {v}\r\n" for k, v in headers.items()) + "\r\n").encode()


def best_us(fn: Any, number: int) -> float:
    return min(timeit.repeat(fn, number=number, repeat=5)) / number * 1e6


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench auth_check", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--number", type=int, default=20_000)
    parser.add_argument("--actors", type=int, default=1_000)
    args = parser.parse_args(argv)
    token_id, token = new_token()
    grants = _snapshot(args.actors, token, token_id)
    # no database: the snapshot counts as refreshed now, with a period that outlasts the run, so TokenPolicy
    # (which refuses a stale snapshot) decides every call, and each call still pays the staleness check
    registry = GrantsRegistry("postgresql://unused", [], refresh_seconds=86_400)
    registry.grants = grants
    registry.refreshed_at = time.monotonic()
    registry.loaded.set()
    payload = create_payload()
    plain = {"Pam-Idempotency-Key": "bench:micro:1"}
    signed = {**plain, AUTHORIZATION_HEADER: f"Bearer {token}"}
    limiter = DenialLimiter(5, 1.0)
    parsed_plain = parse("create", payload, plain, 1 << 20)
    parsed_signed = parse("create", payload, signed, 1 << 20)
    off, enforce = AllowAll(), TokenPolicy(registry)
    assert admit(enforce, limiter, parsed_signed, SUBJECT, signed) is parsed_signed, "the token must be allowed"
    now = datetime.now(timezone.utc)
    claim = Claim(ACTOR["actor_id"])
    n = args.number
    rows = [
        ("baseline: parse(create) (every create pays it)", lambda: parse("create", payload, signed, 1 << 20)),
        ("admit, auth off (AllowAll)", lambda: admit(off, limiter, parsed_plain, SUBJECT, plain)),
        ("admit, auth enforced (TokenPolicy)", lambda: admit(enforce, limiter, parsed_signed, SUBJECT, signed)),
        ("  context_of (header reads), no token", lambda: context_of(SUBJECT, plain)),
        ("  context_of, with the token", lambda: context_of(SUBJECT, signed)),
        ("  decide (pure policy, whole)", lambda: decide(grants, signed[AUTHORIZATION_HEADER], "cmd.create",
                                                         "scope:bench", claim, now)),
        ("    authenticate", lambda: authenticate(grants, signed[AUTHORIZATION_HEADER], now)),
        ("      bearer_token + token_id_of (regex)", lambda: token_id_of(bearer_token(signed[AUTHORIZATION_HEADER]))),
        ("      sha256 + compare_digest", lambda: digest_matches(grants.credentials[token_id].token_digest, token)),
        ("  datetime.now(timezone.utc)", lambda: datetime.now(timezone.utc)),
        ("nats-py header parse, no token", _nats_headers(_raw_headers(plain))),
        ("nats-py header parse, with the token", _nats_headers(_raw_headers(signed))),
    ]
    base = best_us(rows[0][1], n)
    print(f"bench auth_check: best of 5 x {n:,} calls; snapshot of {args.actors:,} actors; us per call"
          f" (and as a share of parse(create) = {base:.2f} us)")
    for name, fn in rows:
        us = base if fn is rows[0][1] else best_us(fn, n)
        print(f"{name:<52} {us:8.2f} us  {us / base:6.1%}")
    return 0
