"""`pamledger actors add|list|revoke` and `pamledger tokens issue|revoke`: who may call, managed over NATS with an
administrative credential (PAMLEDGER_TOKEN, else the state dir's admin.token). Each change is a versioned object
of the system scope (pamledger_client.admin), effective on the next request of every process, no restart."""

from __future__ import annotations

import argparse
import asyncio
from typing import Any

from pamledger_client.config import ClientConfig
from pamledger_client.admin import issue_token, list_records, parse_grant, put_actor, revoke_actor, revoke_token
from pamledger_client.cli_common import connect, invalid, pam_id, print_json
from pamledger_client.protocol.vocabulary import ACTOR_TYPE, CREDENTIAL_TYPE

GRANT_HELP = ("SCOPES=OPERATIONS, repeatable: scopes are exact ids, prefixes ending in '*' or '*' (every scope but "
              "system:pamledger); operations are PAMSPEC's (create, read, update, transition, relate, query, "
              "inspect_history, redact, delete, promote, subscribe, unsubscribe), pamledger's 'validate' (set a validation "
              "state other than unverified: a reviewer's) or '*' (all of them). E.g. 'team:a:*=read,query'")


def add_auth_parsers(sub: Any) -> None:
    actors = sub.add_parser("actors", help="register, list or revoke the actors that may call").add_subparsers(
        dest="actors_action", required=True)
    add = actors.add_parser("add", help="register an actor with its grants (again: replace its grants)")
    add.add_argument("actor_id", type=pam_id)
    add.add_argument("--kind", default="agent", help="actor_kind (default: %(default)s)")
    add.add_argument("--grant", action="append", default=[], help=GRANT_HELP)
    add.add_argument("--name", help="display name")
    actors.add_parser("list", help="registered actors and their grants")
    revoke = actors.add_parser("revoke", help="revoke an actor: all its tokens stop working, its subscriptions close")
    revoke.add_argument("actor_id", type=pam_id)
    tokens = sub.add_parser("tokens", help="issue, list or revoke the tokens of an actor").add_subparsers(
        dest="tokens_action", required=True)
    issue = tokens.add_parser("issue", help="issue a token (printed once: only its digest is stored)")
    issue.add_argument("actor_id", type=pam_id)
    issue.add_argument("--not-after", help="expiry, RFC 3339 (e.g. 2027-01-01T00:00:00Z)")
    issue.add_argument("--label", help="what the token is for")
    tokens.add_parser("list", help="live tokens (ids, actors, expiry; never the tokens)")
    drop = tokens.add_parser("revoke", help="revoke a token by its id")
    drop.add_argument("token_id")


def cmd_actors(config: ClientConfig, args: argparse.Namespace) -> int:
    print_json(asyncio.run(_run(config, _actors, args)))
    return 0


def cmd_tokens(config: ClientConfig, args: argparse.Namespace) -> int:
    print_json(asyncio.run(_run(config, _tokens, args)))
    return 0


async def _run(config: ClientConfig, action: Any, args: argparse.Namespace) -> Any:
    client = await connect(config)
    try:
        return await action(client, args)
    finally:
        await client.close()


async def _actors(client: Any, args: argparse.Namespace) -> Any:
    if args.actors_action == "add":
        try:
            grants = [parse_grant(text) for text in args.grant]
        except ValueError as exc:
            raise invalid(str(exc)) from None
        return await put_actor(client, args.actor_id, args.kind, grants, args.name)
    if args.actors_action == "list":
        return {"actors": await list_records(client, ACTOR_TYPE)}
    return await revoke_actor(client, args.actor_id)


async def _tokens(client: Any, args: argparse.Namespace) -> Any:
    if args.tokens_action == "issue":
        return await issue_token(client, args.actor_id, args.not_after, args.label)
    if args.tokens_action == "list":
        return {"tokens": await list_records(client, CREDENTIAL_TYPE)}
    return await revoke_token(client, args.token_id)
