"""The client command line (`pamledger-client`, `python -m pamledger_client`): commands that speak to the
service through the SDK, with nothing but NATS.

create / read / history / update / transition / delete / scope-create / query / search / related /
subscribe / subscriptions / snapshot / eval / actors / tokens, and the object commands (relate, redact,
promote, ...). The server's CLI (`pamledger`, pamledger.cli) offers the same commands beside the server and
operator ones. Every command prints JSON on stdout; errors ({"error": {...}}, the PAMSPEC envelope) and logs go
to stderr, with a non-zero exit. Configuration: the `PAMLEDGER_*` environment (pamledger_client.config).
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal
import sys
from collections.abc import Callable
from typing import Any

from pamledger_client.cli_auth import add_auth_parsers, cmd_actors, cmd_tokens
from pamledger_client.cli_common import (
    CONTENT_HELP,
    Parser,
    installed_version,
    actor_of,
    add_writer_arguments,
    connect,
    emit_error,
    json_content,
    pam_id,
    print_json,
    provenance_of,
)
from pamledger_client.cli_objects import OBJECT_COMMANDS, add_object_parsers, cmd_objects
from pamledger_client.cli_errors import failed
from pamledger_client.config import ClientConfig
from pamledger_client.cli_query import add_query_parser, query_filters
from pamledger_client.cli_related import add_related_parser, cmd_related
from pamledger_client.cli_search import add_search_parser, search_arguments
from pamledger_client.cli_snapshot import add_snapshot_parser, cmd_snapshot
from pamledger_client.cli_eval import add_eval_parser, cmd_eval
from pamledger_client.cli_subscribe import add_subscribe_parser, cmd_subscribe, cmd_subscriptions
from pamledger_client.protocol.vocabulary import DIMENSION_STATES

ClientHandler = Callable[[ClientConfig, argparse.Namespace], int]
_print = print_json


def cmd_client(config: ClientConfig, args: argparse.Namespace) -> int:
    """create / read / history / update / transition / delete / scope-create / query through the SDK."""
    _print(asyncio.run(_client_call(config, args)))
    return 0


async def _client_call(config: ClientConfig, args: argparse.Namespace) -> Any:
    content = json_content(args.content) if hasattr(args, "content") else None  # before connecting: stdin
    client = await connect(config)
    actor = await actor_of(client, args) if hasattr(args, "actor_id") else {}
    provenance = provenance_of(args, actor)
    try:
        match args.command:
            case "scope-create":
                return await client.create_scope(args.scope_id, args.scope_kind)
            case "create":
                optional = {k: v for k, v in (("object_id", args.object_id), ("schema_id", args.schema_id),
                                              ("idempotency_key", args.idempotency_key)) if v}
                return await client.create(args.scope_id, args.object_type, content, actor, provenance,
                                           **optional)
            case "update":
                return await client.update(args.scope_id, args.object_id, args.expected_version_id,
                                           content, actor, provenance)
            case "transition":
                qualified = {k: v for k, v in (("policy_basis", args.policy_basis),
                                               ("policy_override", args.policy_override)) if v}
                return await client.transition(args.scope_id, args.object_id, args.expected_version_id,
                                               args.dimension, args.target_state, actor, provenance, **qualified)
            case "delete":
                return await client.delete(args.scope_id, args.object_id, args.expected_version_id, actor,
                                           provenance)
            case "read":
                return await client.read(args.scope_id, args.object_id, args.version_id,
                                         snapshot_id=args.snapshot_id)
            case "history":
                return await client.history(args.scope_id, args.object_id, snapshot_id=args.snapshot_id)
            case "query":
                return await client.query(args.scope_id, **query_filters(args))
            case "search":
                return await client.search(args.scope_id, **search_arguments(args))
    finally:
        await client.close()
    raise SystemExit(f"unknown command {args.command}")


def add_client_parsers(sub: Any) -> None:
    """The client commands' parsers, added to `sub` (the subparsers of either CLI)."""
    sc = sub.add_parser("scope-create", help="register a memory scope")
    sc.add_argument("scope_id", type=pam_id)
    sc.add_argument("--scope-kind", default="workspace")
    create = sub.add_parser("create", help="create a memory object")
    create.add_argument("scope_id", type=pam_id)
    create.add_argument("object_type")
    create.add_argument("content", help=CONTENT_HELP)
    create.add_argument("--object-id", type=pam_id)
    create.add_argument("--schema-id", help="the content's schema: needed by an extension type"
                                            " (reverse-DNS or URI object_type, docs/protocol.md)")
    create.add_argument("--idempotency-key")
    add_writer_arguments(create)
    update = sub.add_parser("update", help="write new content as a new version")
    for name in ("scope_id", "object_id", "expected_version_id"):
        update.add_argument(name, type=pam_id)
    update.add_argument("content", help=CONTENT_HELP)
    add_writer_arguments(update)
    transition = sub.add_parser("transition", help="move one state dimension")
    for name in ("scope_id", "object_id", "expected_version_id"):
        transition.add_argument(name, type=pam_id)
    transition.add_argument("dimension", choices=sorted(DIMENSION_STATES), help="one of %(choices)s")
    transition.add_argument("target_state", help="; ".join(
        f"{dimension}: {', '.join(sorted(states))}" for dimension, states in sorted(DIMENSION_STATES.items())))
    transition.add_argument("--policy-basis", help="the policy a qualified move names (e.g. a restoration policy)")
    transition.add_argument("--policy-override", action="store_true",
                            help="a move the 9.5 tables forbid without a policy override (needs --policy-basis)")
    add_writer_arguments(transition)
    delete = sub.add_parser("delete", help="tombstone an object and erase its content")
    for name in ("scope_id", "object_id", "expected_version_id"):
        delete.add_argument(name, type=pam_id)
    add_writer_arguments(delete)
    read = sub.add_parser("read", help="read the current (or a given) version")
    read.add_argument("scope_id", type=pam_id)
    read.add_argument("object_id", type=pam_id)
    read.add_argument("--version-id", type=pam_id)
    hist = sub.add_parser("history", help="versions oldest first and the object's ledger events")
    hist.add_argument("scope_id", type=pam_id)
    hist.add_argument("object_id", type=pam_id)
    for parser in (read, hist):
        parser.add_argument("--snapshot", type=pam_id, dest="snapshot_id",
                            help="as this sealed evaluation snapshot holds the object (`pamledger snapshot create`)")
    add_snapshot_parser(sub)
    add_eval_parser(sub)
    add_object_parsers(sub)
    add_query_parser(sub)
    add_search_parser(sub)
    add_related_parser(sub)
    add_subscribe_parser(sub)
    add_auth_parsers(sub)


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(prog="pamledger-client", description=__doc__,
                    formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--version", action="version",
                        version=f"pamledger-client {installed_version('pamledger-client')}")
    add_client_parsers(parser.add_subparsers(dest="command", required=True))
    return parser


CLIENT_HANDLERS: dict[str, ClientHandler] = {
    "subscribe": cmd_subscribe, "subscriptions": cmd_subscriptions, "actors": cmd_actors, "tokens": cmd_tokens,
    "related": cmd_related, "snapshot": cmd_snapshot, "eval": cmd_eval,
}
CLIENT_HANDLERS.update((name, cmd_objects) for name in OBJECT_COMMANDS)


def handler_for(command: str) -> ClientHandler:
    """The handler of a client command (the SDK calls behind create, read, query ... share one)."""
    return CLIENT_HANDLERS.get(command, cmd_client)


def run_command(handler: ClientHandler, args: argparse.Namespace) -> int:
    """Run one command; whatever it raises (the environment, NATS, the service, a bug) ends as the error
    envelope on stderr with a non-zero exit (pamledger_client.cli_errors). Usage errors exit 2 from the parser."""
    try:
        logging.basicConfig(level=_log_level(), format="%(levelname)s %(name)s: %(message)s")
        return handler(ClientConfig.from_env(), args)
    except BrokenPipeError:
        # The reader of our output went away (`| head`): the command itself ran (a write committed), so say
        # nothing more and exit as a process killed by SIGPIPE would, like other Unix tools.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 128 + signal.SIGPIPE
    except Exception as exc:  # noqa: BLE001 - every failure becomes the envelope (cli_errors.as_pamspec)
        return emit_error(failed(exc))


def _log_level() -> int:
    """PAMLEDGER_LOG_LEVEL as the server reads it (debug, info, warning, error, critical); default warning here:
    a client command's output is its JSON."""
    level = logging.getLevelName(os.environ.get("PAMLEDGER_LOG_LEVEL", "warning").upper())
    return level if isinstance(level, int) else logging.WARNING


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return run_command(handler_for(args.command), args)


if __name__ == "__main__":
    sys.exit(main())
