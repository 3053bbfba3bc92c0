"""`pamledger query | replay | audit`: the read-side and audit commands of the CLI."""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from typing import Any

import psycopg

from infra.endpoints import resolve
from infra.settings import Settings
from query.request import TIME_FIELDS

STATE_OPTIONS = (("--lifecycle", "lifecycle_states"), ("--availability", "availability_states"),
                 ("--retention", "retention_states"), ("--validation", "validation_states"))
LIST_OPTIONS = (("--type", "object_types"), ("--schema-id", "schema_ids"), ("--actor", "actor_ids"),
                ("--provenance", "provenance_ids"), *STATE_OPTIONS)


def add_query_parser(sub: Any) -> None:
    q = sub.add_parser("query", help="query a scope (structured filters, full text, ordering, paging)")
    q.add_argument("scope_id")
    for flag, dest in LIST_OPTIONS:
        q.add_argument(flag, dest=dest, action="append", help=f"repeatable; filters {dest}")
    q.add_argument("--time", nargs=3, action="append", metavar=("FIELD", "GTE", "LT"),
                   help=f"time window on one of {', '.join(TIME_FIELDS)}; '-' leaves a bound open")
    q.add_argument("--seq-gte", type=int)
    q.add_argument("--seq-lte", type=int)
    q.add_argument("--text", help="full-text query (web search syntax)")
    q.add_argument("--order", default="newest")
    q.add_argument("--limit", type=int, default=50)
    q.add_argument("--cursor")
    q.add_argument("--min-sequence", type=int)
    q.add_argument("--as-of", type=int, dest="as_of_sequence", help="the scope as of this ledger sequence")


def query_filters(args: argparse.Namespace) -> dict[str, Any]:
    """The Query request fields named on the command line (unset ones stay at the service's defaults)."""
    body: dict[str, Any] = {dest: getattr(args, dest) for _, dest in LIST_OPTIONS if getattr(args, dest)}
    if args.time:
        body["time"] = {field: {k: v for k, v in (("gte", gte), ("lt", lt)) if v != "-"}
                        for field, gte, lt in args.time}
    seq = {k: v for k, v in (("gte", args.seq_gte), ("lte", args.seq_lte)) if v is not None}
    if seq:
        body["ledger_sequence"] = seq
    for name in ("text", "cursor", "min_sequence", "as_of_sequence"):
        if getattr(args, name) is not None:
            body[name] = getattr(args, name)
    body.update(order=args.order, limit=args.limit)
    return body


def add_audit_parsers(sub: Any) -> None:
    r = sub.add_parser("replay", help="rebuild the projection from the ledger; print its digest")
    r.add_argument("--scope", dest="scope_id")
    r.add_argument("--to-sequence", type=int)
    r.add_argument("--verify", action="store_true", help="compare with the live projection, list differences")
    r.add_argument("--swap", action="store_true", help="replace the live projection by the rebuild")
    r.add_argument("--keep", action="store_true", help="keep the rebuilt table (its name is printed)")
    a = sub.add_parser("audit", help="a scope's objects, versions and states as of a ledger sequence")
    a.add_argument("--scope", dest="scope_id", required=True)
    a.add_argument("--at", type=int, required=True)


def _progress(update: dict[str, Any]) -> None:
    print(json.dumps({"progress": update}), file=sys.stderr, flush=True)


def cmd_replay(settings: Settings, args: argparse.Namespace) -> int:
    from projector.replay import ReplayOptions, replay
    from schemas.errors import PamledgerError

    options = ReplayOptions(scope_id=args.scope_id, to_sequence=args.to_sequence, verify=args.verify,
                            swap=args.swap, keep=args.keep)
    try:
        report = asyncio.run(replay(resolve(settings).database_url, options, _progress))
    except ValueError as exc:
        print(json.dumps({"error": {"code": "invalid_request", "message": str(exc)}}))
        return 2
    except PamledgerError as exc:  # ReplayFailed: names the ledger sequence it cannot project
        print(json.dumps({"error": {"code": exc.code, "message": exc.message, "details": exc.details}}))
        return 1
    print(json.dumps(report, indent=2, sort_keys=True))
    return 0 if report.get("verify", {}).get("equal", True) else 1


def cmd_audit(settings: Settings, args: argparse.Namespace) -> int:
    from projector.audit import audit
    from schemas.errors import PamledgerError

    async def run() -> dict[str, Any]:
        async with await psycopg.AsyncConnection.connect(resolve(settings).database_url) as conn:
            return await audit(conn, args.scope_id, args.at)

    try:
        print(json.dumps(asyncio.run(run()), indent=2, sort_keys=True))
    except PamledgerError as exc:
        print(json.dumps({"error": {"code": exc.code, "message": exc.message, "details": exc.details}}))
        return 1
    return 0
