"""`pamledger verify` and `pamledger stream rebuild`: the ledger's integrity and its replica's identity.

Why here: both act on the servers directly (Postgres and JetStream), as operator commands, not through the
service's subjects; they live apart from the SDK's client commands.
"""

from __future__ import annotations

import argparse
import asyncio
import json
from typing import Any

from authz.operator import require_operator
from infra.endpoints import resolve
from infra.partitions import check_partition_count_at, partition_stream
from infra.settings import Settings
from pamledger_client.cli_common import invalid, progress_for


def add_ledger_parsers(sub: Any) -> None:
    verify = sub.add_parser("verify", help="check the hash chain, every stored column and copy, and the head"
                                           " against the JetStream stream (needs NATS); names the first bad row and"
                                           " check. With several partitions: each one, and ok when all are")
    verify.add_argument("--partition", type=int, default=None,
                        help="verify this partition only (several partitions: every one by default)")
    stream = sub.add_parser("stream", help="the JetStream replica of the ledger")
    actions = stream.add_subparsers(dest="stream_action", required=True)
    rebuild = actions.add_parser("rebuild", help="delete the stream, re-create it for this ledger and republish"
                                                 " every ledger row; close subscriptions whose positions are another"
                                                 " ledger's. Refuses when the stream is this ledger's and holds"
                                                 " events the ledger lacks (a cut-off tail), listing them")
    rebuild.add_argument("--force", action="store_true",
                         help="rebuild even so, throwing those events away (they are the only record of the cut;"
                              " run `pamledger verify` first)")


def cmd_verify(settings: Settings, args: argparse.Namespace) -> int:
    from command_handler.verify import verify_ledger
    from pamledger.nats_users import operator_nats_options

    endpoints = resolve(settings)
    asyncio.run(require_operator(settings, endpoints.database_url))
    check_partition_count_at(endpoints.database_url, settings.partitions)  # "every" partition must be every one
    progress = progress_for(args, "verify", "rows_checked", "head", "rows")
    if settings.partitions == 1 or args.partition is not None:
        partition = settings.partition if args.partition is None else args.partition
        result = asyncio.run(verify_ledger(endpoints.database_url, endpoints.nats_url,
                                           partition_stream(settings.stream_name, partition), partition,
                                           operator_nats_options(settings), progress))
    else:  # every partition, each against its own stream; ok when every one is
        each = {str(p): asyncio.run(verify_ledger(endpoints.database_url, endpoints.nats_url,
                                                  partition_stream(settings.stream_name, p), p,
                                                  operator_nats_options(settings), progress))
                for p in range(settings.partitions)}
        result = {"ok": all(r["ok"] for r in each.values()), "partitions": each,
                  "rows_checked": sum(int(r.get("rows_checked", 0)) for r in each.values())}
    progress.finish()
    print(json.dumps(result, indent=2, sort_keys=True))
    return 0 if result["ok"] else 2


def cmd_stream(settings: Settings, args: argparse.Namespace) -> int:
    if settings.partitions > 1:  # one partition's stream per rebuild: not built for several yet ([X1])
        raise invalid("stream rebuild is not built for a ledger of several partitions yet (docs/architecture.md,"
                      " \"Partitions\")", partitions=settings.partitions)
    endpoints = resolve(settings)
    asyncio.run(require_operator(settings, endpoints.database_url))
    report = asyncio.run(rebuild_stream(settings, endpoints.nats_url, endpoints.database_url, force=args.force))
    print(json.dumps(report, indent=2, sort_keys=True))
    return 0


async def rebuild_stream(settings: Settings, nats_url: str, database_url: str, force: bool = False) -> dict[str, Any]:
    """Replace the stream by one made from this ledger. A running relay, projector and gateway see their
    stream go, re-check it and follow the new one (the projector from its checkpoint: after a checkpoint
    of another ledger, `pamledger replay --swap` resets it). This ledger's stream holding events the
    ledger lacks is the proof that the ledger's tail was cut off: without `force` it is kept, and the
    refusal lists what a rebuild would throw away."""
    import psycopg
    from nats.js.errors import NotFoundError

    from command_handler.relay import Relay
    from infra.ledger import ledger_head
    from infra.nats_servers import stream_replicas
    from infra.ledger_identity import ledger_identity, stream_ledger_id, stream_reuse
    from subscriptions.store import close_foreign_subscriptions
    from pamledger_client.connection import open_nats
    from pamledger.nats_users import operator_nats_options

    # NATS down: one service_unavailable, no traceback per attempt; the service login (it drives JetStream)
    nc = await open_nats(nats_url, 5.0, login=operator_nats_options(settings))
    try:
        js = nc.jetstream()
        async with await psycopg.AsyncConnection.connect(database_url, autocommit=True) as conn:
            ledger_id = await ledger_identity(conn, settings.partition)
            previous: dict[str, Any] | None = None
            try:
                info = await js.stream_info(settings.stream_name)
                previous = {"ledger_id": stream_ledger_id(info), "last_sequence": info.state.last_seq}
                reuse = await stream_reuse(conn, js, settings.stream_name, settings.partition)
                if reuse is not None:
                    previous["discarded"] = await _refuse_unless_forced(conn, js, settings, reuse, force)
                await js.delete_stream(settings.stream_name)
            except NotFoundError:
                pass
            relay = Relay(nc, database_url, settings.stream_name, settings.subject_prefix, settings.partition,
                          replicas=stream_replicas(nats_url, settings.nats.stream_replicas))
            await asyncio.wait_for(relay.catch_up(), timeout=settings.request_timeout_seconds * 30)
            closed = await close_foreign_subscriptions(conn, settings.partition)
            head = await ledger_head(conn, settings.partition)
    finally:
        await nc.close()
    return {"stream": settings.stream_name, "ledger_id": ledger_id, "previous": previous,
            "republished_through": relay.published, "ledger_head": head, "closed_subscriptions": closed}


async def _refuse_unless_forced(conn: Any, js: Any, settings: Settings, reuse: Any, force: bool) -> list[Any]:
    """The stream's events that are not the ledger's (what a rebuild throws away); without `force`, the
    refusal that lists them."""
    from infra.ledger_identity import stream_discards
    from pamledger_client.errors import PamspecError

    discards = await stream_discards(conn, js, settings.stream_name, settings.partition)
    if not force:
        raise PamspecError.of(
            "invalid_request",
            f"this ledger's stream {reuse.problem} (ledger head {reuse.ledger_head}, stream at"
            f" {reuse.found_sequence}): rebuilding throws away {len(discards)}"
            " event(s) the ledger lacks, the only record of its cut-off tail; check with `pamledger verify`,"
            " then run `pamledger stream rebuild --force`",
            {"ledger_head": reuse.ledger_head, "stream_sequence": reuse.found_sequence, "would_discard": discards})
    return discards


async def identity_report(settings: Settings, nc: Any, database_url: str) -> dict[str, Any]:
    """For `pamledger status`: this ledger's id and what the relay, projector and gateway would refuse
    (the same checks they run, so also why a role is waiting)."""
    import nats
    import psycopg

    from infra.ledger_identity import checkpoint_disagreement, ledger_identity, stream_disagreement
    from subscriptions.store import subscriptions_disagreement
    from infra.projections import PROJECTION

    partition = settings.partition
    try:
        async with await psycopg.AsyncConnection.connect(database_url, autocommit=True, connect_timeout=3) as conn:
            found = [await stream_disagreement(conn, nc.jetstream(timeout=3), settings.stream_name, partition),
                     await checkpoint_disagreement(conn, PROJECTION, partition),
                     await subscriptions_disagreement(conn, partition)]
            ledger_id = await ledger_identity(conn, partition)
    except (psycopg.Error, nats.errors.Error, asyncio.TimeoutError) as exc:
        return {"error": type(exc).__name__}
    problems = [d.message() for d in found if d is not None]
    return {"ledger_id": ledger_id, "agrees": not problems, "problems": problems}
