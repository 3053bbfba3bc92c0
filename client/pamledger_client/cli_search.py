"""`pamledger search`: lexical, semantic or hybrid search of one scope, printing the JSON reply."""

from __future__ import annotations

import argparse
from typing import Any

from pamledger_client.cli_common import pam_id, sequence
from pamledger_client.cli_query import add_filter_arguments, filter_arguments
from pamledger_client.protocol.vocabulary import MODES, SEARCH_MAX_LIMIT as MAX_LIMIT

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
    s.add_argument("--snapshot", type=pam_id, dest="snapshot_id",
                   help="search what this sealed evaluation snapshot holds, in a space it names (or the default"
                        " when it was sealed); the same answer after any later write")
    add_filter_arguments(s)


def search_arguments(args: argparse.Namespace) -> dict[str, Any]:
    """The SDK's search() keyword arguments named on the command line."""
    filters = filter_arguments(args)
    return {"text": args.text, "mode": args.mode, "space": args.space, "limit": args.limit,
            "min_sequence": args.min_sequence, "filter": filters or None, "snapshot_id": args.snapshot_id}
