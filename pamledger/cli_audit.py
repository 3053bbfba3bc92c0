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
from infra.partitions import check_partition_count, chosen_partitions
from infra.scopes import scope_partitions
from infra.settings import Settings
from pamledger_client.cli_common import invalid, pam_id, progress_for, sequence


def add_audit_parsers(sub: Any) -> None:
    r = sub.add_parser("replay", help="rebuild the projection from the ledger; print its digest")
    r.add_argument("--scope", dest="scope_id", type=pam_id, help="rebuild one scope only (it must exist)")
    r.add_argument("--to-sequence", type=sequence, help="stop at this ledger sequence (0 to the ledger head)")
    r.add_argument("--verify", action="store_true", help="compare with the live projection, list differences")
    r.add_argument("--swap", action="store_true", help="replace the live projection by the rebuild")
    r.add_argument("--keep", action="store_true", help="keep the rebuilt table (its name is printed)")
    r.add_argument("--partition", type=int, default=None,
                   help="several partitions: rebuild this one's scopes only (default: every partition; --scope:"
                        " the scope's own)")
    a = sub.add_parser("audit", help="a scope's objects, versions and states as of a ledger sequence")
    a.add_argument("--scope", dest="scope_id", type=pam_id, required=True, help="an existing scope")
    a.add_argument("--at", type=sequence, default=None,
                   help="a ledger sequence, 0 to the ledger head (default: the head, the scope as it stands)")


def cmd_replay(settings: Settings, args: argparse.Namespace) -> int:
    from projector.replay import ReplayOptions, replay

    database_url = resolve(settings).database_url
    asyncio.run(require_operator(settings, database_url))
    partitions = asyncio.run(_replay_partitions(database_url, settings, args))
    options = ReplayOptions(scope_id=args.scope_id, to_sequence=args.to_sequence, verify=args.verify,
                            swap=args.swap, keep=args.keep, partitions=partitions,
                            ledger_partitions=settings.partitions)
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


async def _replay_partitions(database_url: str, settings: Settings, args: argparse.Namespace) -> tuple[int, ...]:
    """The partitions a replay rebuilds: the one named, the scope's own, or every one. Refuses an unknown scope
    or partition and a sequence past the partition's head, as `audit` and `query` do."""
    from pamledger_client.errors import PamspecError

    count = settings.partitions
    async with await psycopg.AsyncConnection.connect(database_url) as conn:
        await check_partition_count(conn, count)  # else a swap of "every" partition would drop the others' rows
        chosen = tuple(chosen_partitions(args.partition, count))
        if args.scope_id is not None:
            found = (await scope_partitions(conn, [args.scope_id])).get(args.scope_id)
            if found is None:
                raise PamspecError.of("scope_not_found", "scope not found", {"scope_id": args.scope_id})
            if found not in chosen:
                raise invalid(f"scope {args.scope_id} is in partition {found}, not in --partition {args.partition}",
                              scope_id=args.scope_id, partition=found)
            chosen = (found,)
        if args.to_sequence is not None and len(chosen) == 1:
            head = await ledger_head(conn, chosen[0])
            if args.to_sequence > head:
                raise invalid("--to-sequence is beyond the ledger head", to_sequence=args.to_sequence,
                              ledger_head=head, **({"partition": chosen[0]} if count > 1 else {}))
    return chosen
