"""The `pamledger` command line. Every command prints JSON on stdout; errors ({"error": {...}}, the PAMSPEC
envelope) and logs go to stderr, with a non-zero exit."""

from __future__ import annotations

import argparse
import asyncio
import json
import signal
import sys
from typing import Any

from infra.endpoints import resolve
from infra.logging import configure_logging
from infra.settings import Settings
from memory_client.cli_audit import add_audit_parsers, add_query_parser, cmd_audit, cmd_replay, query_filters
from memory_client.cli_common import Parser, connect, emit_error, json_content, pam_id, print_json
from memory_client.cli_errors import failed
from memory_client.cli_ledger import add_ledger_parsers, cmd_stream, cmd_verify, identity_report
from memory_client.cli_subscribe import add_subscribe_parser, cmd_subscribe, cmd_subscriptions
from memory_client.client import MemoryClient, PamspecError
from schemas.common import DIMENSION_STATES

_print = print_json


def cmd_up(settings: Settings, args: argparse.Namespace) -> int:
    from infra.local_servers import LocalStack
    from infra.migrations import migrate

    stack = LocalStack.up(settings.state_dir)
    applied = migrate(stack.postgres.url)
    _print({"nats_url": stack.nats.url, "database_url": stack.postgres.url, "started": sorted(stack.started),
            "migrations_applied": applied, "state_dir": str(settings.state_dir)})
    return 0


def cmd_down(settings: Settings, args: argparse.Namespace) -> int:
    from infra.local_servers import stop_from_file

    stop_from_file(settings.state_dir)
    _print({"stopped": True, "state_dir": str(settings.state_dir)})
    return 0


def cmd_clean(settings: Settings, args: argparse.Namespace) -> int:
    """Stop the local servers and delete the state dir and its Postgres data: the only command that does."""
    from infra.local_servers import clean

    clean(settings.state_dir)
    _print({"cleaned": True, "state_dir": str(settings.state_dir)})
    return 0


def cmd_run(settings: Settings, args: argparse.Namespace) -> int:
    """Start local servers unless URLs are set, migrate, then serve: one process per role (default) or
    every role in this process (`--single-process` / PAMLEDGER_PROCESSES=single)."""
    from infra.migrations import migrate
    from infra.supervisor import child_environment, parse_roles, supervise

    roles = parse_roles(args.roles)
    stack = None
    if not (settings.nats_url and settings.database_url):
        from infra.local_servers import LocalStack

        stack = LocalStack.up(settings.state_dir)
        settings = settings.model_copy(update={"nats_url": stack.nats.url, "database_url": stack.postgres.url})
    assert settings.nats_url and settings.database_url
    single = args.single_process or settings.processes == "single"
    try:
        migrate(settings.database_url)
        print(json.dumps({"serving": True, "nats_url": settings.nats_url, "database_url": settings.database_url,
                          "roles": list(roles), "processes": "single" if single else "split"}), file=sys.stderr)
        if single:
            asyncio.run(_serve(settings, roles))
        else:
            watches = stack.watches() if stack is not None else []
            supervise(child_environment(settings.nats_url, settings.database_url), roles, watches=watches)
    finally:
        if stack is not None:
            stack.stop_started()
    return 0


def cmd_serve(settings: Settings, args: argparse.Namespace) -> int:
    """One process serving the given roles on servers named by the settings (what `run` spawns)."""
    from infra.supervisor import parse_roles

    endpoints = resolve(settings)
    settings = settings.model_copy(update={"nats_url": endpoints.nats_url, "database_url": endpoints.database_url})
    asyncio.run(_serve(settings, parse_roles(args.roles)))
    return 0


async def _serve(settings: Settings, roles: tuple[str, ...]) -> None:
    from infra.runtime import run_service

    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    assert settings.nats_url and settings.database_url
    await run_service(settings, settings.nats_url, settings.database_url, stop, roles=roles)


def cmd_status(settings: Settings, args: argparse.Namespace) -> int:
    endpoints = resolve(settings)  # none found: main() prints the envelope on stderr, like every error
    report: dict[str, Any] = {"state_dir": str(settings.state_dir)}
    report.update(nats_url=endpoints.nats_url, database_url=endpoints.database_url, source=endpoints.source)
    report.update(asyncio.run(_probe(settings, endpoints.nats_url, endpoints.database_url)))
    report["problems"] = _problems(report)
    _print(report)
    for problem in report["problems"]:  # the same, for a person at a terminal (stdout stays one JSON value)
        print(f"pamledger status: {problem}", file=sys.stderr)
    return 0 if report["nats"]["answers"] and report["postgres"]["answers"] and not report["problems"] else 1


def _problems(report: dict[str, Any]) -> list[str]:
    """One sentence per role that reports itself stuck (a follower retrying an event it cannot apply)."""
    problems = []
    for role in ("writer", "query", "projector", "gateway"):
        stuck = report.get(role, {}).get("stuck")
        if stuck:
            problems.append(f"{role} stuck at ledger sequence {stuck['sequence']} since {stuck['since']}"
                            f" ({stuck['attempts']} attempts): {stuck['reason']}")
    return problems


async def _probe(settings: Settings, nats_url: str, database_url: str) -> dict[str, Any]:
    import psycopg

    from projector.store import checkpoint

    out: dict[str, Any] = {"nats": {"answers": False}, "postgres": {"answers": False}}
    try:
        async with await psycopg.AsyncConnection.connect(database_url, connect_timeout=3) as conn:
            cur = await conn.execute("SELECT coalesce(max(ledger_sequence), 0) FROM ledger WHERE partition = %s",
                                     (settings.partition,))
            row = await cur.fetchone()
            head = row[0] if row else 0
            projected = await checkpoint(conn)
            # How far Query's current-version tables trail the ledger (0: every committed event is queryable).
            out["postgres"] = {"answers": True, "ledger_sequence": head, "projection_checkpoint": projected,
                               "projection_behind": head - projected}
    except psycopg.Error as exc:
        out["postgres"] = {"answers": False, "error": type(exc).__name__}
    try:
        client = await MemoryClient.connect(nats_url, settings.subject_prefix, timeout=2.0)
    except Exception as exc:  # noqa: BLE001 - any connect failure means "does not answer"
        out["nats"] = {"answers": False, "error": type(exc).__name__}
        return out
    out["nats"] = {"answers": True}
    if out["postgres"]["answers"]:
        out["ledger"] = await identity_report(settings, client.nc, database_url)
    client.retries = 0
    async def ask(component: str) -> dict[str, Any]:
        try:
            return {"answers": True, **await client.status(component)}
        except PamspecError as exc:
            return {"answers": False, "error": exc.code}

    components = ("writer", "query", "projector", "gateway")  # asked at once: one timeout, not four
    out.update(zip(components, await asyncio.gather(*(ask(c) for c in components))))
    await client.close()
    return out


def cmd_client(settings: Settings, args: argparse.Namespace) -> int:
    """create / read / history / update / transition / delete / scope-create / query through the SDK."""
    _print(asyncio.run(_client_call(settings, args)))
    return 0


async def _client_call(settings: Settings, args: argparse.Namespace) -> Any:
    content = json_content(args.content) if hasattr(args, "content") else None  # before connecting: stdin
    client = await connect(settings)
    actor = {"actor_id": args.actor_id, "actor_kind": args.actor_kind} if hasattr(args, "actor_id") else {}
    provenance = {"provenance_id": getattr(args, "provenance_id", None) or "prov:cli", "actor": actor,
                  "activity": getattr(args, "activity", "cli")}
    try:
        match args.command:
            case "scope-create":
                return await client.create_scope(args.scope_id, args.scope_kind)
            case "create":
                optional = {k: v for k, v in (("object_id", args.object_id),
                                              ("idempotency_key", args.idempotency_key)) if v}
                return await client.create(args.scope_id, args.object_type, content, actor, provenance,
                                           **optional)
            case "update":
                return await client.update(args.scope_id, args.object_id, args.expected_version_id,
                                           content, actor, provenance)
            case "transition":
                return await client.transition(args.scope_id, args.object_id, args.expected_version_id,
                                               args.dimension, args.target_state, actor, provenance)
            case "delete":
                return await client.delete(args.scope_id, args.object_id, args.expected_version_id, actor,
                                           provenance)
            case "read":
                return await client.read(args.scope_id, args.object_id, args.version_id)
            case "history":
                return await client.history(args.scope_id, args.object_id)
            case "query":
                return await client.query(args.scope_id, **query_filters(args))
    finally:
        await client.close()
    raise SystemExit(f"unknown command {args.command}")


def cmd_conformance(settings: Settings, args: argparse.Namespace) -> int:
    from memory_client.conformance import run_adapter

    return run_adapter(settings)


CONTENT_HELP = "canonical content as JSON; @PATH reads it from a file, - from stdin"


def _writer_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--actor-id", default="actor:cli:user")
    p.add_argument("--actor-kind", default="human")
    p.add_argument("--provenance-id", default=None)
    p.add_argument("--activity", default="cli")


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(prog="pamledger", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("up", help="start local NATS and Postgres in the background and migrate")
    sub.add_parser("down", help="stop the servers `up` started")
    sub.add_parser("clean", help="stop the local servers and DELETE their data (the ledger) in the state dir")
    sub.add_parser("status", help="URLs in use, whether servers and services answer, the ledger head")
    run = sub.add_parser("run", help="serve in the foreground (starts local servers unless URLs are set)")
    run.add_argument("--local", action="store_true", help="accepted for clarity; local servers are the default")
    run.add_argument("--single-process", action="store_true", help="every role in one process (default: one each)")
    run.add_argument("--roles", default="all", help="comma-separated subset of writer,query,projector,gateway")
    serve = sub.add_parser("serve", help="serve some roles in this process on running servers (what run spawns)")
    serve.add_argument("--roles", default="all", help="comma-separated subset of writer,query,projector,gateway")
    add_ledger_parsers(sub)
    sub.add_parser("conformance-adapter", help="PAMSPEC conformance harness protocol v1 on stdin/stdout")
    sc = sub.add_parser("scope-create", help="register a memory scope")
    sc.add_argument("scope_id", type=pam_id)
    sc.add_argument("--scope-kind", default="workspace")
    create = sub.add_parser("create", help="create a memory object")
    create.add_argument("scope_id", type=pam_id)
    create.add_argument("object_type")
    create.add_argument("content", help=CONTENT_HELP)
    create.add_argument("--object-id", type=pam_id)
    create.add_argument("--idempotency-key")
    _writer_args(create)
    update = sub.add_parser("update", help="write new content as a new version")
    for name in ("scope_id", "object_id", "expected_version_id"):
        update.add_argument(name, type=pam_id)
    update.add_argument("content", help=CONTENT_HELP)
    _writer_args(update)
    transition = sub.add_parser("transition", help="move one state dimension")
    for name in ("scope_id", "object_id", "expected_version_id"):
        transition.add_argument(name, type=pam_id)
    transition.add_argument("dimension", choices=sorted(DIMENSION_STATES), help="one of %(choices)s")
    transition.add_argument("target_state", help="; ".join(
        f"{dimension}: {', '.join(sorted(states))}" for dimension, states in sorted(DIMENSION_STATES.items())))
    _writer_args(transition)
    delete = sub.add_parser("delete", help="tombstone an object and erase its content")
    for name in ("scope_id", "object_id", "expected_version_id"):
        delete.add_argument(name, type=pam_id)
    _writer_args(delete)
    read = sub.add_parser("read", help="read the current (or a given) version")
    read.add_argument("scope_id", type=pam_id)
    read.add_argument("object_id", type=pam_id)
    read.add_argument("--version-id", type=pam_id)
    hist = sub.add_parser("history", help="versions oldest first and the object's ledger events")
    hist.add_argument("scope_id", type=pam_id)
    hist.add_argument("object_id", type=pam_id)
    add_query_parser(sub)
    add_audit_parsers(sub)
    add_subscribe_parser(sub)
    return parser


HANDLERS = {
    "up": cmd_up, "down": cmd_down, "clean": cmd_clean, "run": cmd_run, "serve": cmd_serve, "status": cmd_status,
    "verify": cmd_verify, "stream": cmd_stream,
    "conformance-adapter": cmd_conformance, "replay": cmd_replay, "audit": cmd_audit,
    "subscribe": cmd_subscribe, "subscriptions": cmd_subscriptions,
}


def main(argv: list[str] | None = None) -> int:
    """Run one command; whatever it raises (settings, NATS, Postgres, local servers, a bug) ends as the error
    envelope on stderr with a non-zero exit. Usage errors exit 2 from the parser, with the envelope too."""
    args = build_parser().parse_args(argv)
    settings: Settings | None = None
    try:
        settings = Settings()
        configure_logging(settings.log_format, settings.log_level)
        return HANDLERS.get(args.command, cmd_client)(settings, args)
    except Exception as exc:  # noqa: BLE001 - every failure becomes the envelope (cli_errors.as_pamspec)
        state_dir = str(settings.state_dir) if settings is not None else None
        return emit_error(failed(exc, state_dir, settings is not None, serving=args.command in ("run", "serve")))


if __name__ == "__main__":
    sys.exit(main())
