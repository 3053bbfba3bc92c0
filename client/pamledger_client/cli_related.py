"""`pamledger related`: the relationships around an object and the objects they reach (query.related)."""

from __future__ import annotations

import argparse
import asyncio
from typing import Any

from pamledger_client.config import ClientConfig
from pamledger_client.cli_common import connect, pam_id, print_json, sequence
from pamledger_client.protocol.vocabulary import DIMENSION_STATES, MAX_HOPS, QUERY_MAX_LIMIT as MAX_LIMIT

RELATED_EPILOG = (
    "Walks the relationships of one object, breadth first, up to --hops steps (1 to 3). By default: both "
    "directions, every relationship type, available relationships only. Objects reached in another scope "
    "are shown only where you may read that scope (else `not_readable`); gone ones say `deleted`, "
    "`redacted` or `not_found`.")
_STATE_FLAGS = (("--availability", "availability_states", "availability"),
                ("--lifecycle", "lifecycle_states", "lifecycle"),
                ("--retention", "retention_states", "retention"),
                ("--validation", "validation_states", "validation"))


def add_related_parser(sub: Any) -> None:
    r = sub.add_parser("related", help="the relationships around an object (by type, direction, hops)",
                       description=RELATED_EPILOG)
    r.add_argument("scope_id", type=pam_id)
    r.add_argument("object_id", type=pam_id)
    r.add_argument("--type", dest="relationship_types", action="append",
                   help="repeatable; relationship_type to follow (default: all)")
    r.add_argument("--direction", default="both", choices=("outgoing", "incoming", "both"),
                   help="(default: %(default)s)")
    r.add_argument("--hops", type=int, default=1, help=f"1 to {MAX_HOPS} (default: %(default)s)")
    r.add_argument("--limit", type=int, default=50, help=f"edges, 1 to {MAX_LIMIT} (default: %(default)s)")
    for flag, dest, dimension in _STATE_FLAGS:
        r.add_argument(flag, dest=dest, action="append", choices=sorted(DIMENSION_STATES[dimension]),
                       metavar="STATE", help=f"repeatable; the relationships' {dimension} states, one of %(choices)s"
                       + (" (default: available)" if dimension == "availability" else " (default: any)"))
    r.add_argument("--min-sequence", type=sequence, help="wait until the projection has reached this sequence")
    r.add_argument("--snapshot", type=pam_id, dest="snapshot_id",
                   help="the relationships between this sealed evaluation snapshot's members, at its watermark")


def related_arguments(args: argparse.Namespace) -> dict[str, Any]:
    """The SDK's related() keyword arguments named on the command line (unset ones: the service's defaults)."""
    found: dict[str, Any] = {"relationship_types": args.relationship_types, "direction": args.direction,
                             "hops": args.hops, "limit": args.limit}
    for _, dest, _ in _STATE_FLAGS:
        if getattr(args, dest):
            found[dest] = getattr(args, dest)
    for name in ("min_sequence", "snapshot_id"):
        if getattr(args, name) is not None:
            found[name] = getattr(args, name)
    return found


def cmd_related(config: ClientConfig, args: argparse.Namespace) -> int:
    print_json(asyncio.run(_related(config, args)))
    return 0


async def _related(config: ClientConfig, args: argparse.Namespace) -> Any:
    client = await connect(config)
    try:
        return await client.related(args.scope_id, args.object_id, **related_arguments(args))
    finally:
        await client.close()
