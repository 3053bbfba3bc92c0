"""The `pamledger` command line: the server and admin commands, and every client command of the SDK's CLI.

run / serve / up / down / clean / status / verify / stream / replay / audit live here, in the composition
root, because they assemble or inspect roles; so do export / import and the conformance adapter; client
commands (create, read, query, subscribe ...) are pamledger_client.cli's (the client distribution's CLI). Every command prints JSON on stdout; errors ({"error": {...}}, the PAMSPEC envelope)
and logs go to stderr, with a non-zero exit."""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import sys
from typing import Any

from infra.endpoints import resolve
from infra.settings import Settings
from mcp_binding.main import add_mcp_parser
from pamledger_client.cli import add_client_parsers, handler_for
from pamledger.cli_bundle import add_bundle_parsers, cmd_export, cmd_import as cmd_import_bundle
from pamledger.cli_dispatch import Handler, dispatch, server_handler
from pamledger_client.cli_common import Parser, installed_version, invalid, print_json
from pamledger_client.client import MemoryClient, PamspecError
from pamledger.cli_audit import add_audit_parsers, cmd_audit, cmd_replay
from pamledger.cli_backup import add_backup_parsers, cmd_backup, cmd_restore
from pamledger.cli_cursor_keys import add_cursor_keys_parser, cmd_cursor_keys
from pamledger.cli_index import add_index_parsers, cmd_index, cmd_spaces
from pamledger.cli_mem0 import add_mem0_arguments, cmd_import_mem0
from pamledger.cli_ledger import add_ledger_parsers, cmd_stream, cmd_verify, identity_report
from pamledger.cli_retention import add_retention_parsers, cmd_retention
from pamledger.cli_scrub import add_scrub_parser, cmd_scrub
from pamledger.supervisor import ROLES, enabled_optional_roles

_print = print_json


def cmd_up(settings: Settings, args: argparse.Namespace) -> int:
    from local_servers.launch import LocalStack
    from infra.migrations import migrate

    from pamledger.auth import prepare_credentials
    from pamledger.nats_users import prepare_nats_config, sync_nats_users

    settings = with_nats_nodes(settings, args)
    credentials = prepare_credentials(settings)  # before NATS starts: its users include the admin token
    prepare_nats_config(settings)
    stack = LocalStack.up(settings.state_dir, settings.nats.nodes, pg_replica=args.pg_replica)
    applied = migrate(stack.postgres.url)
    asyncio.run(sync_nats_users(settings, stack.postgres.url))  # the ledger's tokens can log in to NATS now
    replica = {"database_read_urls": [stack.replica.url]} if stack.replica is not None else {}
    _print({"nats_url": stack.nats_url, "database_url": stack.postgres.url, **replica,
            "started": sorted(stack.started), "migrations_applied": applied, "state_dir": str(settings.state_dir),
            **credentials})
    return 0


def with_nats_nodes(settings: Settings, args: argparse.Namespace) -> Settings:
    """`--nats-nodes N` wins over nats.nodes (PAMLEDGER_NATS__NODES)."""
    nodes = getattr(args, "nats_nodes", None)
    if nodes is None:
        return settings
    return settings.model_copy(update={"nats": settings.nats.model_copy(update={"nodes": nodes})})


def cmd_down(settings: Settings, args: argparse.Namespace) -> int:
    from local_servers.launch import stop_from_file

    stop_from_file(settings.state_dir)
    _print({"stopped": True, "state_dir": str(settings.state_dir)})
    return 0


def cmd_clean(settings: Settings, args: argparse.Namespace) -> int:
    """Stop the local servers and delete the state dir and its Postgres data: the only command that does."""
    from local_servers.launch import clean

    clean(settings.state_dir)
    _print({"cleaned": True, "state_dir": str(settings.state_dir)})
    return 0


def cmd_run(settings: Settings, args: argparse.Namespace) -> int:
    """Start local servers unless URLs are set, migrate, then serve: one process per role (default) or
    every role in this process (`--single-process` / PAMLEDGER_PROCESSES=single)."""
    from infra.migrations import migrate
    from pamledger.auth import prepare_credentials
    from pamledger.readiness import announce_when_ready
    from pamledger.supervisor import child_environment, enabled_optional_roles, parse_roles, supervise

    roles = parse_roles(args.roles, enabled_optional_roles(settings.retention.enabled))
    settings = with_nats_nodes(settings, args)
    stack = None
    credentials = prepare_credentials(settings)
    if not (settings.nats_url and settings.database_url):
        from local_servers.launch import LocalStack
        from pamledger.nats_users import prepare_nats_config

        prepare_nats_config(settings)  # NATS users and permissions (docs/security.md, "Transport")
        stack = LocalStack.up(settings.state_dir, settings.nats.nodes, pg_replica=args.pg_replica)
        settings = settings.model_copy(update={"nats_url": stack.nats_url, "database_url": stack.postgres.url})
        if stack.replica is not None and not settings.database.read_urls:
            settings = settings.model_copy(update={"database": settings.database.model_copy(
                update={"read_urls": [stack.replica.url]})})
    assert settings.nats_url and settings.database_url
    single = args.single_process or settings.processes == "single"
    try:
        migrate(settings.database_url)
        if (refused := partition_count_refused(settings.database_url, settings.partitions)) is not None:
            print(f"pamledger run: {refused}", file=sys.stderr)
            return 2
        if stack is not None:
            from pamledger.nats_users import sync_nats_users

            asyncio.run(sync_nats_users(settings, settings.database_url))
        announce_when_ready(settings, roles, {
            "nats_url": settings.nats_url, "database_url": settings.database_url, "roles": list(roles),
            "processes": "single" if single else "split", **credentials})  # "serving" once every role answers
        if single:
            asyncio.run(_serve(settings, roles))
        else:
            watches = stack.watches() if stack is not None else []
            supervise(child_environment(settings.nats_url, settings.database_url, settings.database.read_urls),
                      roles, watches=watches)
    finally:
        if stack is not None:
            stack.stop_started()
    return 0


def cmd_serve(settings: Settings, args: argparse.Namespace) -> int:
    """One process serving the given roles on servers named by the settings (what `run` spawns)."""
    from pamledger.supervisor import enabled_optional_roles, parse_roles

    endpoints = resolve(settings)
    settings = settings.model_copy(update={"nats_url": endpoints.nats_url, "database_url": endpoints.database_url,
                                           "database": settings.database.model_copy(
                                               update={"read_urls": list(endpoints.read_urls)})})
    roles = parse_roles(args.roles, enabled_optional_roles(settings.retention.enabled))
    if roles == ("indexer",) and settings.indexer.nice:
        os.nice(settings.indexer.nice)  # the embedder yields the CPU to the writer (`run`: a process per role)
    if settings.database_url:
        try:
            refused = partition_count_refused(settings.database_url, settings.partitions, record="writer" in roles)
        except Exception:  # noqa: BLE001 - the database away: the writer checks again before it appends
            refused = None
        if refused is not None:
            print(f"pamledger serve: {refused}", file=sys.stderr)
            return 2
    asyncio.run(_serve(settings, roles))
    return 0


def partition_count_refused(database_url: str, partitions: int, record: bool = True) -> str | None:
    """Why this ledger refuses the `partitions` setting (infra.partitions), None when it agrees. Recorded on
    the first start of a writer (`record`); a ledger of another count is never re-hashed, and a follower,
    query or gateway with another count would serve some partitions only."""
    import psycopg

    from infra.partitions import PartitionCountChanged, check_partition_count_at, recorded_partitions

    try:
        if record:
            with psycopg.connect(database_url, autocommit=True) as conn:
                recorded_partitions(conn, partitions)
        else:
            check_partition_count_at(database_url, partitions)
    except PartitionCountChanged as exc:
        return str(exc)
    return None


async def _serve(settings: Settings, roles: tuple[str, ...]) -> None:
    from pamledger.runtime import run_service

    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    assert settings.nats_url and settings.database_url
    await run_service(settings, settings.nats_url, settings.database_url, stop, roles=roles)


def cmd_status(settings: Settings, args: argparse.Namespace) -> int:
    endpoints = resolve(settings)  # none found: dispatch prints the envelope on stderr, like every error
    report: dict[str, Any] = {"state_dir": str(settings.state_dir)}
    report.update(nats_url=endpoints.nats_url, database_url=endpoints.database_url, source=endpoints.source)
    report.update(asyncio.run(_probe(settings, endpoints.nats_url, endpoints.database_url, endpoints.read_urls)))
    report["probes"] = probe_urls(settings)
    report["problems"] = _problems(report)
    _print(report)
    for problem in report["problems"]:  # the same, for a person at a terminal (stdout stays one JSON value)
        print(f"pamledger status: {problem}", file=sys.stderr)
    return 0 if report["nats"]["answers"] and report["postgres"]["answers"] and not report["problems"] else 1


def probe_urls(settings: Settings) -> dict[str, str]:
    """Where each role's /metrics is (its /healthz and /readyz beside it), as `run` lays them out."""
    from pamledger.runtime import PROBE_OFFSETS

    base, host = settings.metrics.port, settings.metrics.host
    if base <= 0:
        return {}
    single = settings.processes == "single"
    return {role: f"http://{host}:{base + (0 if single else offset)}/metrics" for role, offset in PROBE_OFFSETS.items()
            if role != "retention" or settings.retention.enabled}


def _problems(report: dict[str, Any]) -> list[str]:
    """One sentence per role that reports itself stuck (a follower retrying an event it cannot apply), and per
    NATS node, stream replica or read replica that is away (pamledger.status_servers)."""
    from pamledger.status_servers import degraded

    problems = []
    for role in ROLES:
        stuck = report.get(role, {}).get("stuck")
        if stuck:
            problems.append(f"{role} stuck at ledger sequence {stuck['sequence']} since {stuck['since']}"
                            f" ({stuck['attempts']} attempts): {stuck['reason']}")
    return problems + degraded(report)


async def _probe(settings: Settings, nats_url: str, database_url: str,
                 read_urls: tuple[str, ...] = ()) -> dict[str, Any]:
    import psycopg

    from infra.ledger import ledger_head
    from infra.projections import checkpoint
    from pamledger.status_servers import nats_nodes, read_replicas

    out: dict[str, Any] = {"nats": {"answers": False}, "postgres": {"answers": False}}
    try:
        async with await psycopg.AsyncConnection.connect(database_url, connect_timeout=3) as conn:
            head = await ledger_head(conn, settings.partition)
            projected = await checkpoint(conn)
            # How far Query's current-version tables trail the ledger (0: every committed event is queryable).
            out["postgres"] = {"answers": True, "ledger_sequence": head, "projection_checkpoint": projected,
                               "projection_behind": head - projected}
            out["postgres"].update(await _index_position(conn, settings.partition))
            if settings.partitions > 1:
                out["postgres"]["partitions"] = await _partition_positions(conn, settings.partitions)
    except psycopg.Error as exc:
        out["postgres"] = {"answers": False, "error": type(exc).__name__}
    if read_urls:  # each replica on its own (the query role's view of them is in `query.database`)
        out["postgres"]["read_replicas"] = await read_replicas(database_url, read_urls)
    nodes = await nats_nodes(nats_url)  # a cluster: every node, reachable or not
    from pamledger.cli_dispatch import client_config
    from pamledger_client.connection import open_nats
    from pamledger.nats_users import operator_nats_options

    try:  # the service login: the ledger report reads the stream; status answers the token's caller (the
        # administrator sees pids and positions, another actor health only, none: access_denied)
        client = MemoryClient(await open_nats(nats_url, 2.0, login=operator_nats_options(settings)),
                              settings.subject_prefix, 2.0, token=client_config(settings).find_token())  # `caller`: whoami
        client._owns = True
    except Exception as exc:  # noqa: BLE001 - any connect failure means "does not answer"
        out["nats"] = {"answers": False, "error": type(exc).__name__, **({"nodes": nodes} if nodes else {})}
        return out
    out["nats"] = {"answers": True, **await _cluster(settings, client.nc, nodes)}
    if out["postgres"]["answers"]:
        out["ledger"] = await identity_report(settings, client.nc, database_url)
    client.retries = 0
    async def ask(component: str) -> dict[str, Any]:
        try:
            return {"answers": True, **await client.status(component)}
        except PamspecError as exc:
            return {"answers": False, "error": exc.code}

    components = ROLES + enabled_optional_roles(settings.retention.enabled)  # asked at once: one timeout
    out.update(zip(components, await asyncio.gather(*(ask(c) for c in components))))
    out["caller"] = await _caller(client)
    await client.close()
    return out


async def _cluster(settings: Settings, nc: Any, nodes: list[dict[str, Any]] | None) -> dict[str, Any]:
    """With a JetStream cluster: every node and where each partition's stream leads and has replicas."""
    from infra.partitions import partition_stream
    from pamledger.status_servers import stream_placements, with_leads

    streams = [partition_stream(settings.stream_name, p) for p in range(settings.partitions)]
    placements = await stream_placements(nc, streams)
    if nodes is None and all(p.get("replicas", 1) < 2 for p in placements):
        return {}  # one server, streams of one copy: as before clusters
    return {"nodes": with_leads(nodes or [], placements), "streams": placements}


async def _partition_positions(conn: Any, partitions: int) -> dict[str, dict[str, int]]:
    """Each partition's ledger head and projection checkpoint (the lines above are partition 0's)."""
    from infra.ledger import ledger_head
    from infra.projections import PROJECTION, checkpoint, partition_checkpoint

    out = {}
    for partition in range(partitions):
        head = await ledger_head(conn, partition)
        projected = await checkpoint(conn, partition_checkpoint(PROJECTION, partition))
        out[str(partition)] = {"ledger_sequence": head, "projection_checkpoint": projected,
                               "projection_behind": head - projected}
    return out


async def _caller(client: MemoryClient) -> dict[str, Any]:
    """Who this CLI is to the service (the token it found, docs/security.md), or why it is nobody."""
    try:
        found = await client.whoami()
    except PamspecError as exc:
        return {"authenticated": False, "error": exc.code, "rule": exc.policy_rule_id,
                "hint": "set PAMLEDGER_TOKEN, or run where the state dir holds admin.token"}
    return found


async def _index_position(conn: Any, partition: int) -> dict[str, Any]:
    """The indexer's checkpoint and backlog, and each space's state and backlog (no counts: status stays cheap)."""
    from indexer.report import spaces_report

    report = await spaces_report(conn, partition, counts=False)
    return {"indexer_checkpoint": report["indexer_checkpoint"], "indexer_behind": report["backlog"], "spaces": [
        {k: s[k] for k in ("embedding_space_id", "state", "default", "embedder", "backlog")}
        for s in report["spaces"]]}


def cmd_mcp(settings: Settings, args: argparse.Namespace) -> int:
    """The MCP binding in the foreground (stdio: until the host closes it; HTTP: until Ctrl-C)."""
    from mcp_binding.main import run

    return run(settings, args)


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(prog="pamledger", description=__doc__)
    parser.add_argument("--version", action="version", version=f"pamledger {installed_version()}")
    sub = parser.add_subparsers(dest="command", required=True)
    up = sub.add_parser("up", help="start local NATS and Postgres in the background and migrate")
    up.add_argument("--local", action="store_true", help="accepted for clarity; local servers are what up starts")
    up.add_argument("--pg-replica", action="store_true",
                    help="also a streaming read replica of the local Postgres, read by the query role")
    up.add_argument("--nats-nodes", type=_node_count, help="NATS as a JetStream cluster of N nodes (nats.nodes)")
    sub.add_parser("down", help="stop the servers `up` started")
    sub.add_parser("clean", help="stop the local servers and DELETE their data (the ledger) in the state dir")
    sub.add_parser("status", help="URLs in use, whether servers and services answer, the ledger head")
    run = sub.add_parser("run", help="serve in the foreground (starts local servers unless URLs are set)")
    run.add_argument("--local", action="store_true", help="accepted for clarity; local servers are the default")
    run.add_argument("--nats-nodes", type=_node_count, help="local NATS as a JetStream cluster of N nodes (nats.nodes)")
    run.add_argument("--single-process", action="store_true", help="every role in one process (default: one each)")
    run.add_argument("--pg-replica", action="store_true",
                     help="with local servers: also a streaming read replica of Postgres, read by the query role")
    run.add_argument("--roles", default="all", help=f"comma-separated subset of {','.join(ROLES)},retention")
    serve = sub.add_parser("serve", help="serve some roles in this process on running servers (what run spawns)")
    serve.add_argument("--roles", default="all", help=f"comma-separated subset of {','.join(ROLES)},retention")
    add_ledger_parsers(sub)
    add_client_parsers(sub)
    add_bundle_parsers(sub, ("pamledger", "mem0"))
    sub.add_parser("conformance-adapter", help="PAMSPEC conformance harness protocol v1 on stdin/stdout")
    add_audit_parsers(sub)
    add_index_parsers(sub)
    add_retention_parsers(sub)
    add_scrub_parser(sub)
    add_mcp_parser(sub)
    add_backup_parsers(sub)
    add_cursor_keys_parser(sub)
    _add_import_parser(sub)
    return parser


def _node_count(text: str) -> int:
    count = int(text)
    if not 1 <= count <= 7:
        raise argparse.ArgumentTypeError("NATS nodes: 1 to 7 (a cluster: 3 or 5)")
    return count


def _add_import_parser(sub: Any) -> None:
    """The client CLI's `import` (bundles) takes --from mem0 here too, with its options (docs/mem0.md)."""
    add_mem0_arguments(sub.choices["import"], with_actor=False)


def cmd_import(settings: Settings, args: argparse.Namespace) -> int:
    """A pamledger bundle (pamledger.cli_bundle) or, --from mem0, a Mem0 export (pamledger.cli_mem0)."""
    if args.source != "mem0":
        return cmd_import_bundle(settings, args)
    if args.scope is None:
        raise invalid("import --from mem0 needs --scope: where memories go unless a rule places them elsewhere")
    return cmd_import_mem0(settings, args)


def cmd_conformance(settings: Settings, args: argparse.Namespace) -> int:
    from pamledger.conformance import run_adapter

    return run_adapter(settings)


HANDLERS: dict[str, Handler] = {
    "export": cmd_export, "conformance-adapter": cmd_conformance,
    "up": cmd_up, "down": cmd_down, "clean": cmd_clean, "run": cmd_run, "serve": cmd_serve, "status": cmd_status,
    "verify": cmd_verify, "stream": cmd_stream, "replay": cmd_replay, "audit": cmd_audit,
    "spaces": cmd_spaces, "index": cmd_index, "retention": cmd_retention, "scrub": cmd_scrub, "mcp": cmd_mcp,
    "import": cmd_import, "backup": cmd_backup, "restore": cmd_restore, "cursor-keys": cmd_cursor_keys,
}


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return dispatch(HANDLERS.get(args.command) or server_handler(handler_for(args.command)), args,
                    serving=args.command in ("run", "serve"))


if __name__ == "__main__":
    sys.exit(main())
