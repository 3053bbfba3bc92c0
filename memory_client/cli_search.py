"""`pamledger search`: lexical, semantic or hybrid search of one scope, printing the JSON reply."""

from __future__ import annotations

import argparse
from typing import Any

from memory_client.cli_common import pam_id, sequence
from memory_client.cli_query import LIST_OPTIONS, STATE_OPTIONS
from schemas.common import DIMENSION_STATES
from schemas.search import MAX_LIMIT, MODES

SEARCH_EPILOG = (
    "Searches one scope in one Embedding Space (--space, default: the default space). Like query, it shows "
    "only trusted memory by default (active, available, retained, corroborated): a new object is "
    "`unverified`, so add `--validation unverified` to see it.")


def add_search_parser(sub: Any) -> None:
    s = sub.add_parser("search", help="search a scope by text (hybrid, semantic or lexical)",
                       description=SEARCH_EPILOG)
    s.add_argument("scope_id", type=pam_id)
    s.add_argument("text")
    s.add_argument("--mode", default="hybrid", choices=MODES, help="(default: %(default)s)")
    s.add_argument("--space", help="embedding space id (default: the default space)")
    s.add_argument("--limit", type=int, default=10, help=f"1 to {MAX_LIMIT} (default: %(default)s)")
    s.add_argument("--min-sequence", type=sequence,
                   help="wait until the projection (and for semantic/hybrid the index) has reached this sequence")
    for flag, dest in LIST_OPTIONS[:4]:
        s.add_argument(flag, dest=dest, action="append", help=f"repeatable; filters {dest}")
    for flag, dest, dimension in STATE_OPTIONS:
        s.add_argument(flag, dest=dest, action="append", choices=sorted(DIMENSION_STATES[dimension]),
                       metavar="STATE", help="repeatable; one of %(choices)s")


def search_arguments(args: argparse.Namespace) -> dict[str, Any]:
    """The SDK's search() keyword arguments named on the command line."""
    filters = {dest: getattr(args, dest) for _, dest in LIST_OPTIONS if getattr(args, dest)}
    return {"text": args.text, "mode": args.mode, "space": args.space, "limit": args.limit,
            "min_sequence": args.min_sequence, "filter": filters or None}
