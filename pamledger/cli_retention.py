"""`pamledger retention evaluate [--scope S] [--dry-run]`: one round of the retention evaluator, now.

An operator command (the caller needs a grant on the system scope where auth is enforced, like replay): it
reads Postgres itself and sends its proposals as the retention actor with the service's own credential (the
state dir's service.token), the one the `retention` role sends with. Prints the round as JSON: counts, the
policies it could not read, and every proposal.
"""

from __future__ import annotations

import argparse
import asyncio
import json
from datetime import datetime, timezone
from typing import Any

import psycopg

from authz.bootstrap import service_token
from authz.operator import require_operator
from infra.endpoints import resolve
from infra.requester import CommandRequester
from infra.settings import Settings
from pamledger_client.cli_common import invalid, pam_id
from retention.evaluator import evaluate


def add_retention_parsers(sub: Any) -> None:
    r = sub.add_parser("retention", help="the retention evaluator: propose expirations (valid_until, scope policy)")
    actions = r.add_subparsers(dest="retention_command", required=True)
    e = actions.add_parser("evaluate", help="one round now: propose (and unless --dry-run send) expirations")
    e.add_argument("--scope", dest="scope_id", type=pam_id, help="evaluate one scope only")
    e.add_argument("--dry-run", action="store_true", help="print the proposals, write nothing")
    e.add_argument("--limit", type=int, default=None, help="proposals at most (default retention.max_per_round)")


def cmd_retention(settings: Settings, args: argparse.Namespace) -> int:
    endpoints = resolve(settings)
    asyncio.run(require_operator(settings, endpoints.database_url))
    limit = args.limit if args.limit is not None else settings.retention.max_per_round
    if limit < 1:
        raise invalid("--limit must be at least 1", limit=limit)
    report = asyncio.run(_evaluate(settings, endpoints.nats_url, endpoints.database_url, args.scope_id,
                                   args.dry_run, limit))
    print(json.dumps(report, indent=2, sort_keys=True))
    return 0 if not report.get("failed") else 1


async def _evaluate(settings: Settings, nats_url: str, database_url: str, scope_id: str | None, dry_run: bool,
                    limit: int) -> dict[str, Any]:
    from pamledger.runtime import connect_nats

    now = datetime.now(timezone.utc)
    async with await psycopg.AsyncConnection.connect(database_url, autocommit=True) as conn:
        if dry_run:
            return (await evaluate(conn, None, now, scope_id, limit)).report()
        token = service_token(settings)
        nc = await connect_nats(nats_url, "pamledger-retention-cli", settings)
        try:
            requester = CommandRequester(nc, settings.subject_prefix, settings.request_timeout_seconds, token=token)
            return (await evaluate(conn, requester, now, scope_id, limit)).report()
        finally:
            await nc.close()
