"""`pamledger replay | audit`: the audit commands of the CLI (they read Postgres directly)."""

from __future__ import annotations

import argparse
import asyncio
import json
from typing import Any

import psycopg

from authz.operator import require_operator
from infra.endpoints import resolve
from infra.ledger import ledger_head
from infra.scopes import scope_exists, scope_partitions
from infra.settings import Settings
from pamledger_client.cli_common import invalid, pam_id, progress_for, sequence


def add_audit_parsers(sub: Any) -> None:
    r = sub.add_parser("replay", help="rebuild the projection from the ledger; print its digest")
    r.add_argument("--scope", dest="scope_id", type=pam_id, help="rebuild one scope only (it must exist)")
    r.add_argument("--to-sequence", type=sequence, help="stop at this ledger sequence (0 to the ledger head)")
    r.add_argument("--verify", action="store_true", help="compare with the live projection, list differences")
    r.add_argument("--swap", action="store_true", help="replace the live projection by the rebuild")
    r.add_argument("--keep", action="store_true", help="keep the rebuilt table (its name is printed)")
    a = sub.add_parser("audit", help="a scope's objects, versions and states as of a ledger sequence")
    a.add_argument("--scope", dest="scope_id", type=pam_id, required=True, help="an existing scope")
    a.add_argument("--at", type=sequence, default=None,
                   help="a ledger sequence, 0 to the ledger head (default: the head, the scope as it stands)")


def cmd_replay(settings: Settings, args: argparse.Namespace) -> int:
    from projector.replay import ReplayOptions, replay

    if settings.partitions > 1:  # replay rebuilds one partition's projection: not built for several yet ([X1])
        raise invalid("replay is not built for a ledger of several partitions yet (docs/architecture.md,"
                      " \"Partitions\")", partitions=settings.partitions)
    options = ReplayOptions(scope_id=args.scope_id, to_sequence=args.to_sequence, verify=args.verify,
                            swap=args.swap, keep=args.keep, partition=settings.partition)
    database_url = resolve(settings).database_url
    asyncio.run(require_operator(settings, database_url))
    asyncio.run(_check_replay_arguments(database_url, settings.partition, args.scope_id, args.to_sequence))
    progress = progress_for(args, "replay", "done", "total", "events")
    try:
        report = asyncio.run(replay(database_url, options, progress))
    except ValueError as exc:
        raise invalid(str(exc)) from None
    finally:
        progress.finish()
    print(json.dumps(report, indent=2, sort_keys=True))
    return 0 if report.get("verify", {}).get("equal", True) else 1


def cmd_audit(settings: Settings, args: argparse.Namespace) -> int:
    from projector.audit import audit

    async def run() -> dict[str, Any]:
        await require_operator(settings, resolve(settings).database_url, args.scope_id)
        async with await psycopg.AsyncConnection.connect(resolve(settings).database_url) as conn:
            # `at` is a sequence of the scope's partition (infra.partitions): the one it was created in
            partition = (await scope_partitions(conn, [args.scope_id])).get(args.scope_id, settings.partition)
            at = await ledger_head(conn, partition) if args.at is None else args.at
            return await audit(conn, args.scope_id, at, partition)

    print(json.dumps(asyncio.run(run()), indent=2, sort_keys=True))  # errors: main() prints the envelope
    return 0


async def _check_replay_arguments(database_url: str, partition: int, scope_id: str | None,
                                  to_sequence: int | None) -> None:
    """Refuse an unknown scope or a sequence past the ledger head, as `audit` and `query` do."""
    from pamledger_client.errors import PamspecError

    async with await psycopg.AsyncConnection.connect(database_url) as conn:
        if scope_id is not None and not await scope_exists(conn, scope_id):
            raise PamspecError.of("scope_not_found", "scope not found", {"scope_id": scope_id})
        head = await ledger_head(conn, partition)
        if to_sequence is not None and to_sequence > head:
            raise invalid("--to-sequence is beyond the ledger head", to_sequence=to_sequence, ledger_head=head)
