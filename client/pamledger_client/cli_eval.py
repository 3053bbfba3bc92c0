"""`pamledger eval start | end | diff`: evaluation runs forked from a sealed snapshot (docs/protocol.md, eval_start).

`start` prints the run and, where auth is enforced, the run's credential (its token, shown once): hand it to
the agent under evaluation. `end` closes the run and revokes that credential; the scope stays readable.
"""

from __future__ import annotations

import argparse
import asyncio
from typing import Any

from pamledger_client.config import ClientConfig
from pamledger_client.cli_common import actor_of, add_actor_arguments, connect, pam_id, print_json
from pamledger_client.evaluation import end_run, start_run


def add_eval_parser(sub: Any) -> None:
    evaluation = sub.add_parser("eval", help="evaluation runs forked from a sealed snapshot: start, end")
    calls = evaluation.add_subparsers(dest="eval_command", required=True)
    start = calls.add_parser("start", help="open an evaluation run on a sealed snapshot (prints its credential)",
                             description="Forks SNAPSHOT of SCOPE into a new evaluation scope (default "
                                         "eval:<run id>): its commands take the snapshot's deterministic clock and "
                                         "seed and name the run in provenance. With auth enforced, prints a token "
                                         "that may write in the evaluation scope only.")
    start.add_argument("scope_id", type=pam_id, metavar="SCOPE")
    start.add_argument("snapshot_id", type=pam_id, metavar="SNAPSHOT")
    start.add_argument("--scope", type=pam_id, dest="evaluation_scope_id", help="the evaluation scope's id")
    start.add_argument("--run-id", type=pam_id, dest="evaluation_run_id",
                       help="the run's id (default: the snapshot's evaluation_run_id)")
    add_actor_arguments(start)
    end = calls.add_parser("end", help="close an evaluation run (its scope stays readable; its credential is revoked)")
    end.add_argument("evaluation_scope_id", type=pam_id, metavar="EVAL_SCOPE")
    add_actor_arguments(end)
    diff = calls.add_parser("diff", help="what the evaluation scope changed against a sealed snapshot",
                            description="Objects the run added, removed and changed (their versions and events) "
                                        "against SNAPSHOT of the run's base scope; pages as `snapshot diff`.")
    diff.add_argument("evaluation_scope_id", type=pam_id, metavar="EVAL_SCOPE")
    diff.add_argument("snapshot_id", type=pam_id, metavar="SNAPSHOT")
    diff.add_argument("--after", type=pam_id, dest="after_object_id", help="the page after this object id")
    diff.add_argument("--limit", type=int, default=100, help="objects per page, 1 to 1000 (default: %(default)s)")


def cmd_eval(config: ClientConfig, args: argparse.Namespace) -> int:
    print_json(asyncio.run(_call(config, args)))
    return 0


async def _call(config: ClientConfig, args: argparse.Namespace) -> Any:
    client = await connect(config)
    try:
        if args.eval_command == "diff":
            return await client.eval_diff(args.evaluation_scope_id, args.snapshot_id, args.after_object_id, args.limit)
        actor = await actor_of(client, args)
        if args.eval_command == "start":
            return await start_run(client, args.scope_id, args.snapshot_id, actor, args.evaluation_scope_id,
                                   args.evaluation_run_id)
        return await end_run(client, args.evaluation_scope_id, actor)
    finally:
        await client.close()
