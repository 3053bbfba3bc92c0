"""`pamledger backup` and `pamledger restore`: the database's online backup, and its restore that erases again what
was erased after the backup (pamledger/backup.py, pamledger/restore.py; README "Backup and restore").

Why here: both act on Postgres and JetStream directly, as operator commands; restore also runs the writer,
the projector and the indexer for a while, which only the composition root may assemble.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from pathlib import Path
from typing import Any

from authz.operator import require_operator
from infra.endpoints import resolve
from infra.settings import Settings
from pamledger_client.cli_common import print_json, progress_for
from schemas.errors import InvalidRequest


def add_backup_parsers(sub: Any) -> None:
    backup = sub.add_parser("backup", help="a consistent online backup of the database (pg_dump of one snapshot)"
                                           " with a manifest: ledger id, head sequence and hash, versions")
    backup.add_argument("--out", required=True, help="the backup folder to make (must not exist, or be empty)")
    backup.add_argument("--include-secrets", action="store_true",
                        help="also copy the state dir's tokens and NATS service password (left out by default)")
    backup.add_argument("--quiet", action="store_true", help="no progress on stderr")
    restore = sub.add_parser("restore", help="put a backup back into a stopped service (or a new state dir), rebuild"
                                             " the stream and erase again what was erased after the backup")
    restore.add_argument("backup", nargs="?", help="the backup folder (`pamledger backup --out`)")
    restore.add_argument("--replace", action="store_true",
                         help="replace the database even though it holds a ledger (its entries after the backup are lost)")
    restore.add_argument("--accept-unverified-erasures", action="store_true",
                         help="restore although the erasure journal cannot vouch for the backup's ledger: content"
                              " erased after the backup may come back")
    restore.add_argument("--erasures-only", action="store_true",
                         help="no backup: erase again every journaled erasure the ledger lacks (a database put back"
                              " by other means)")
    restore.add_argument("--quiet", action="store_true", help="no progress on stderr")


def cmd_backup(settings: Settings, args: argparse.Namespace) -> int:
    from pamledger.backup import take_backup

    endpoints = resolve(settings)
    asyncio.run(require_operator(settings, endpoints.database_url))
    progress = progress_for(args, "backup")
    result = asyncio.run(take_backup(settings, endpoints.database_url, Path(args.out), args.include_secrets, progress))
    progress.finish()
    print_json(result)
    return 0


def cmd_restore(settings: Settings, args: argparse.Namespace) -> int:
    """Restore on the servers the settings name, else on the state dir's local ones (started when they are not
    running, and stopped again after)."""
    from infra.migrations import migrate

    if (args.backup is None) == (not args.erasures_only):
        raise InvalidRequest("restore takes a backup folder, or --erasures-only without one")
    if args.backup is not None and not Path(args.backup).is_dir():
        raise InvalidRequest("no such backup folder", details={"backup": args.backup})
    stack = None
    if not (settings.nats_url and settings.database_url):
        stack, settings = _local_servers(settings)
    assert settings.nats_url and settings.database_url
    try:
        migrate(settings.database_url)  # a new state dir's database: the operator check reads its grants
        asyncio.run(require_operator(settings, settings.database_url))
        progress = progress_for(args, "restore", "done", "of", "erasures")
        result = asyncio.run(_restore(settings, args, progress))
        progress.finish()
        if stack is not None:
            from pamledger.nats_users import sync_nats_users

            asyncio.run(sync_nats_users(settings, settings.database_url))  # the restored ledger's tokens
    finally:
        if stack is not None:
            stack.stop_started()
    print_json(result)
    refused = result["erasures"]["refused"]
    for item in refused:
        print(f"pamledger restore: erasure {item['event_id']} of {item['object_id']} could not be done again:"
              f" {item['code']}: {item['message']}", file=sys.stderr)
    if not result["erasures"].get("verified", True):
        print("pamledger restore: WARNING: the erasure journal could not vouch for this ledger; content erased after"
              " the backup may be back (--accept-unverified-erasures)", file=sys.stderr)
    return 2 if refused else 0


async def _restore(settings: Settings, args: argparse.Namespace, progress: Any) -> dict[str, Any]:
    from command_handler.erasure_journal import journal_for
    from pamledger.restore import reapply_erasures, restore

    assert settings.nats_url and settings.database_url
    if args.erasures_only:
        journal = journal_for(settings)
        outcome = await reapply_erasures(settings, settings.nats_url, settings.database_url, journal, progress)
        return {"erasures": {**outcome, "journal": str(journal.path)}}
    return await restore(settings, settings.nats_url, settings.database_url, Path(args.backup), args.replace,
                         args.accept_unverified_erasures, progress)


def _local_servers(settings: Settings) -> tuple[Any, Settings]:
    """The state dir's NATS and Postgres (started as `pamledger up` does, credentials first)."""
    from local_servers.launch import LocalStack
    from pamledger.auth import prepare_credentials
    from pamledger.nats_users import prepare_nats_config

    prepare_credentials(settings)
    prepare_nats_config(settings)
    stack = LocalStack.up(settings.state_dir, settings.nats.nodes)
    return stack, settings.model_copy(update={"nats_url": stack.nats_url, "database_url": stack.postgres.url})
