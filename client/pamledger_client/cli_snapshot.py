"""`pamledger snapshot create | list | show | diff`: sealed evaluation snapshots (docs/protocol.md, snapshot_create).

`create` prints the sealed descriptor; reads at a snapshot are `--snapshot ID` on read, history and query.
Every request names its scope (one scope per operation), so `show` takes SCOPE as well as the id.
"""

from __future__ import annotations

import argparse
import asyncio
from typing import Any

from pamledger_client.config import ClientConfig
from pamledger_client.cli_common import actor_of, add_actor_arguments, connect, pam_id, print_json, sequence


def add_snapshot_parser(sub: Any) -> None:
    snapshot = sub.add_parser("snapshot", help="sealed evaluation snapshots: create, list, show, diff")
    calls = snapshot.add_subparsers(dest="snapshot_command", required=True)
    create = calls.add_parser("create", help="seal a snapshot of the scope (prints its descriptor)",
                              description="Pins SCOPE at ledger sequence --at (default: the head), restricted to "
                                          "--objects when given (default: every object of the scope). Once sealed "
                                          "it never changes.")
    create.add_argument("scope_id", type=pam_id)
    create.add_argument("--at", type=sequence, help="the watermark ledger sequence (default: the head)")
    create.add_argument("--objects", type=pam_id, nargs="+", metavar="ID", help="the member objects")
    create.add_argument("--id", type=pam_id, dest="snapshot_id", help="the snapshot's id (default: snap:<uuid>)")
    create.add_argument("--evaluation-run-id", type=pam_id, help="the evaluation run it is sealed for")
    create.add_argument("--clock", type=_clock, metavar="START,TICK_MS",
                        help="the run's deterministic clock: RFC 3339 start and milliseconds per entry")
    create.add_argument("--seed", type=int, help="the run's deterministic_rng_seed (ids and salts of its writes)")
    add_actor_arguments(create)
    listing = calls.add_parser("list", help="the scope's sealed snapshots, in sealing order")
    listing.add_argument("scope_id", type=pam_id)
    listing.add_argument("--after", type=sequence, default=0, help="those sealed after this ledger sequence")
    listing.add_argument("--limit", type=int, default=100, help="1 to 1000 (default: %(default)s)")
    show = calls.add_parser("show", help="one sealed snapshot's descriptor")
    show.add_argument("scope_id", type=pam_id)
    show.add_argument("snapshot_id", type=pam_id)
    diff = calls.add_parser("diff", help="what changed in the scope from snapshot A to snapshot B",
                            description="Objects added (held by B only), removed (by A only) and changed (both, at "
                                        "other versions: their versions and events between the two watermarks). "
                                        "One page in object id order; while `truncated`, pass its "
                                        "`after_object_id` as --after.")
    diff.add_argument("scope_id", type=pam_id)
    diff.add_argument("a", type=pam_id, metavar="A")
    diff.add_argument("b", type=pam_id, metavar="B")
    diff.add_argument("--after", type=pam_id, dest="after_object_id", help="the page after this object id")
    diff.add_argument("--limit", type=int, default=100, help="objects per page, 1 to 1000 (default: %(default)s)")


def _clock(text: str) -> dict[str, Any]:
    """`START,TICK_MS` as a deterministic_clock (its clock_ref names it)."""
    start, _, tick = text.partition(",")
    if not start or not tick.isdigit() or int(tick) < 1:
        raise argparse.ArgumentTypeError("expected START,TICK_MS (e.g. 2026-07-17T00:00:00Z,1000)")
    return {"clock_ref": f"clock:cli:{start}", "start_at": start, "tick_ms": int(tick)}


def cmd_snapshot(config: ClientConfig, args: argparse.Namespace) -> int:
    print_json(asyncio.run(_call(config, args)))
    return 0


async def _call(config: ClientConfig, args: argparse.Namespace) -> Any:
    client = await connect(config)
    try:
        if args.snapshot_command == "list":
            return await client.snapshot_list(args.scope_id, args.after, args.limit)
        if args.snapshot_command == "show":
            return await client.snapshot_show(args.scope_id, args.snapshot_id)
        if args.snapshot_command == "diff":
            return await client.snapshot_diff(args.scope_id, args.a, args.b, args.after_object_id, args.limit)
        extra: dict[str, Any] = {"evaluation_run_id": args.evaluation_run_id} if args.evaluation_run_id else {}
        if args.clock is not None:
            extra["deterministic_clock"] = args.clock
        if args.seed is not None:
            extra["deterministic_rng_seed"] = args.seed
        sealed = await client.snapshot_create(args.scope_id, await actor_of(client, args), at=args.at,
                                              object_ids=args.objects, snapshot_id=args.snapshot_id, **extra)
        return sealed["snapshot"]
    finally:
        await client.close()
