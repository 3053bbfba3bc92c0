"""`pamledger query`: the Query command of the CLI, its flags and the request fields they make."""

from __future__ import annotations

import argparse
from typing import Any

from pamledger_client.cli_common import pam_id, sequence
from pamledger_client.protocol.vocabulary import (
    DIMENSION_STATES, ORDERS, QUERY_MAX_LIMIT as MAX_LIMIT, TIME_FIELDS, TRUSTED_STATES,
)

# flag, request field, the dimension whose states it takes
STATE_OPTIONS = (("--lifecycle", "lifecycle_states", "lifecycle"),
                 ("--availability", "availability_states", "availability"),
                 ("--retention", "retention_states", "retention"),
                 ("--validation", "validation_states", "validation"))
LIST_OPTIONS = (("--type", "object_types"), ("--schema-id", "schema_ids"), ("--actor", "actor_ids"),
                ("--provenance", "provenance_ids"), *((flag, dest) for flag, dest, _ in STATE_OPTIONS))
QUERY_EPILOG = (
    "By default a query shows only trusted memory: lifecycle active, availability available, retention "
    "retained, validation corroborated. A new object is `unverified`, so a plain `query SCOPE` right after "
    "`create` shows nothing: add `--validation unverified` (repeat a state flag to allow several states).")


def add_query_parser(sub: Any) -> None:
    q = sub.add_parser("query", help="query a scope (structured filters, full text, ordering, paging)",
                       description=QUERY_EPILOG)
    q.add_argument("scope_id", type=pam_id)
    add_filter_arguments(q)
    q.add_argument("--time", nargs=3, action="append", metavar=("FIELD", "GTE", "LT"),
                   help=f"time window on one of {', '.join(TIME_FIELDS)}; '-' leaves a bound open")
    q.add_argument("--seq-gte", type=sequence)
    q.add_argument("--seq-lte", type=sequence)
    q.add_argument("--text", help="full-text query (web search syntax)")
    q.add_argument("--order", default="newest", choices=ORDERS, metavar="ORDER",
                   help="one of %(choices)s (default: %(default)s; score needs --text)")
    q.add_argument("--limit", type=int, default=50, help=f"1 to {MAX_LIMIT} (default: %(default)s)")
    q.add_argument("--cursor", help="the next_cursor of the previous page")
    q.add_argument("--min-sequence", type=sequence, help="wait until the projection has reached this sequence")
    q.add_argument("--as-of", type=sequence, dest="as_of_sequence", help="the scope as of this ledger sequence")
    q.add_argument("--snapshot", type=pam_id, dest="snapshot_id",
                   help="the scope as this sealed evaluation snapshot holds it (`pamledger snapshot create`)")


def add_filter_arguments(parser: argparse.ArgumentParser) -> None:
    """The structured filter flags `query` and `search` share (the type, schema, actor and provenance lists
    and the four state dimensions with their trusted defaults); `filter_arguments` reads them back."""
    for flag, dest in LIST_OPTIONS[:4]:
        parser.add_argument(flag, dest=dest, action="append", help=f"repeatable; filters {dest}")
    for flag, dest, dimension in STATE_OPTIONS:
        default = TRUSTED_STATES[dimension]
        parser.add_argument(flag, dest=dest, action="append", choices=sorted(DIMENSION_STATES[dimension]),
                            metavar="STATE", help=f"repeatable; one of %(choices)s (default: {', '.join(default)})")


def filter_arguments(args: argparse.Namespace) -> dict[str, Any]:
    """The filter flags given on the command line (unset ones stay at the service's defaults)."""
    return {dest: getattr(args, dest) for _, dest in LIST_OPTIONS if getattr(args, dest)}


def query_filters(args: argparse.Namespace) -> dict[str, Any]:
    """The Query request fields named on the command line (unset ones stay at the service's defaults)."""
    body = filter_arguments(args)
    if args.time:
        body["time"] = {field: {k: v for k, v in (("gte", gte), ("lt", lt)) if v != "-"}
                        for field, gte, lt in args.time}
    seq = {k: v for k, v in (("gte", args.seq_gte), ("lte", args.seq_lte)) if v is not None}
    if seq:
        body["ledger_sequence"] = seq
    for name in ("text", "cursor", "min_sequence", "as_of_sequence", "snapshot_id"):
        if getattr(args, name) is not None:
            body[name] = getattr(args, name)
    body.update(order=args.order, limit=args.limit)
    return body
