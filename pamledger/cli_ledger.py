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
from infra.partitions import check_partition_count_at, chosen_partitions, partition_stream
from infra.settings import Settings
from pamledger_client.cli_common import progress_for

Found = tuple[dict[str, Any], Any] | None  # a partition's stream as found, and why it refuses appends (or None)


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
    rebuild.add_argument("--partition", type=int, default=None,
                         help="rebuild this partition's stream only (several partitions: every one by default)")


def cmd_verify(settings: Settings, args: argparse.Namespace) -> int:
    from command_handler.verify import verify_ledger
    from pamledger.nats_users import operator_nats_options

    endpoints = resolve(settings)
    asyncio.run(require_operator(settings, endpoints.database_url))
    check_partition_count_at(endpoints.database_url, settings.partitions)  # "every" partition must be every one
    chosen = chosen_partitions(args.partition, settings.partitions)
    progress = progress_for(args, "verify", "rows_checked", "head", "rows")
    if len(chosen) == 1:
        partition = settings.partition if settings.partitions == 1 else chosen[0]
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
    endpoints = resolve(settings)
    partitions = chosen_partitions(args.partition, settings.partitions)
    asyncio.run(require_operator(settings, endpoints.database_url))
    check_partition_count_at(endpoints.database_url, settings.partitions)  # "every" partition must be every one
    if settings.partitions == 1:  # one partition: its stream, its report (as before partitions)
        report = asyncio.run(rebuild_stream(settings, endpoints.nats_url, endpoints.database_url, force=args.force))
    else:
        each = asyncio.run(rebuild_streams(settings, endpoints.nats_url, endpoints.database_url, partitions,
                                           args.force))
        report = {"partitions": {str(p): r for p, r in each.items()}, "summary": {
            "streams_rebuilt": len(each), "republished": sum(int(r["republished_through"]) for r in each.values()),
            "closed_subscriptions": sum(len(r["closed_subscriptions"]) for r in each.values())}}
    print(json.dumps(report, indent=2, sort_keys=True))
    return 0


async def rebuild_stream(settings: Settings, nats_url: str, database_url: str, force: bool = False) -> dict[str, Any]:
    """Replace the stream by one made from this ledger (`settings.partition`'s: a ledger of one partition).
    A running relay, projector and gateway see their stream go, re-check it and follow the new one (the
    projector from its checkpoint: after a checkpoint of another ledger, `pamledger replay --swap` resets
    it). This ledger's stream holding events the ledger lacks is the proof that the ledger's tail was cut
    off: without `force` it is kept, and the refusal lists what a rebuild would throw away."""
    reports = await rebuild_streams(settings, nats_url, database_url, [settings.partition], force)
    return reports[settings.partition]


async def rebuild_streams(settings: Settings, nats_url: str, database_url: str, partitions: list[int],
                          force: bool = False) -> dict[int, dict[str, Any]]:
    """rebuild_stream for each of `partitions`, each against its own stream. Every stream is checked before
    any is touched: one partition's cut-off tail refuses the whole command (without `force`), naming it."""
    import psycopg

    from pamledger_client.connection import open_nats
    from pamledger.nats_users import operator_nats_options

    # NATS down: one service_unavailable, no traceback per attempt; the service login (it drives JetStream)
    nc = await open_nats(nats_url, 5.0, login=operator_nats_options(settings))
    try:
        js = nc.jetstream()
        async with await psycopg.AsyncConnection.connect(database_url, autocommit=True) as conn:
            found = {p: await _found_stream(conn, js, settings, p) for p in partitions}
            discards = await _refuse_unless_forced(conn, js, settings, found, force)
            return {p: await _rebuild_one(nc, conn, settings, nats_url, database_url, p, found[p], discards.get(p))
                    for p in partitions}
    finally:
        await nc.close()


async def _found_stream(conn: Any, js: Any, settings: Settings, partition: int) -> Found:
    """The partition's stream as found (its ledger id and last sequence) and why appending to it would reuse
    sequences (None: it would not); None when there is no stream."""
    from nats.js.errors import NotFoundError

    from infra.ledger_identity import stream_ledger_id, stream_reuse

    stream = _stream_of(settings, partition)
    try:
        info = await js.stream_info(stream)
    except NotFoundError:
        return None
    previous = {"ledger_id": stream_ledger_id(info), "last_sequence": info.state.last_seq}
    return previous, await stream_reuse(conn, js, stream, partition)


async def _rebuild_one(nc: Any, conn: Any, settings: Settings, nats_url: str, database_url: str, partition: int,
                       found: Found, discarded: list[Any] | None) -> dict[str, Any]:
    """Delete the partition's stream, make it again from its ledger rows, close foreign subscriptions."""
    from nats.js.errors import NotFoundError

    from command_handler.relay import Relay
    from infra.ledger import ledger_head
    from infra.ledger_identity import ledger_identity
    from infra.nats_servers import stream_replicas
    from subscriptions.store import close_foreign_subscriptions

    stream = _stream_of(settings, partition)
    ledger_id = await ledger_identity(conn, partition)
    previous = None if found is None else found[0]
    if previous is not None and discarded is not None:
        previous["discarded"] = discarded
    if found is not None:
        try:
            await nc.jetstream().delete_stream(stream)
        except NotFoundError:
            pass
    relay = Relay(nc, database_url, stream, settings.subject_prefix, partition,
                  replicas=stream_replicas(nats_url, settings.nats.stream_replicas),
                  partitioned=settings.partitions > 1)
    await asyncio.wait_for(relay.catch_up(), timeout=settings.request_timeout_seconds * 30)
    closed = await close_foreign_subscriptions(conn, partition)
    head = await ledger_head(conn, partition)
    report = {"stream": stream, "ledger_id": ledger_id, "previous": previous,
              "republished_through": relay.published, "ledger_head": head, "closed_subscriptions": closed}
    return report if settings.partitions == 1 else {"partition": partition, **report}


async def _refuse_unless_forced(conn: Any, js: Any, settings: Settings, found: dict[int, Found],
                                force: bool) -> dict[int, list[Any]]:
    """Each refused partition's stream events that are not the ledger's (what a rebuild throws away); without
    `force`, the refusal that lists them (naming the partitions when the ledger has several)."""
    from infra.ledger_identity import stream_discards
    from pamledger_client.errors import PamspecError

    refused = {p: entry[1] for p, entry in found.items() if entry is not None and entry[1] is not None}
    discards = {p: await stream_discards(conn, js, _stream_of(settings, p), p) for p in refused}
    if force or not refused:
        return discards
    advice = (" the only record of its cut-off tail; check with `pamledger verify`, then run"
              " `pamledger stream rebuild --force`")
    if settings.partitions == 1:
        (partition, reuse), = refused.items()
        raise PamspecError.of(
            "invalid_request",
            f"this ledger's stream {reuse.problem} (ledger head {reuse.ledger_head}, stream at"
            f" {reuse.found_sequence}): rebuilding throws away {len(discards[partition])} event(s) the ledger lacks,"
            + advice,
            {"ledger_head": reuse.ledger_head, "stream_sequence": reuse.found_sequence,
             "would_discard": discards[partition]})
    each = "; ".join(f"partition {p}'s stream {_stream_of(settings, p)} {reuse.problem} (ledger head"
                     f" {reuse.ledger_head}, stream at {reuse.found_sequence}): rebuilding throws away"
                     f" {len(discards[p])} event(s) the ledger lacks" for p, reuse in refused.items())
    raise PamspecError.of(
        "invalid_request", f"{each}; they are" + advice + " (`--partition N`: that partition only)",
        {"partitions": {str(p): {"stream": _stream_of(settings, p), "ledger_head": r.ledger_head,
                                 "stream_sequence": r.found_sequence, "would_discard": discards[p]}
                        for p, r in refused.items()}})


def _stream_of(settings: Settings, partition: int) -> str:
    """The partition's stream (a ledger of one partition: `stream_name`, whatever `partition` is set to)."""
    return settings.stream_name if settings.partitions == 1 else partition_stream(settings.stream_name, partition)


async def identity_report(settings: Settings, nc: Any, database_url: str) -> dict[str, Any]:
    """For `pamledger status`: this ledger's id and what the relay, projector and gateway would refuse
    (the same checks they run, so also why a role is waiting). Several partitions: each one's id against
    its stream's, checkpoint's and subscriptions'; it agrees when every partition does."""
    import nats
    import psycopg

    several = settings.partitions > 1
    partitions = list(range(settings.partitions)) if several else [settings.partition]
    try:
        async with await psycopg.AsyncConnection.connect(database_url, autocommit=True, connect_timeout=3) as conn:
            each = {p: await _partition_identity(settings, conn, nc.jetstream(timeout=3), p, several)
                    for p in partitions}
    except (psycopg.Error, nats.errors.Error, asyncio.TimeoutError) as exc:
        return {"error": type(exc).__name__}
    if not several:
        only = each[partitions[0]]
        return {"ledger_id": only["ledger_id"], "agrees": only["agrees"], "problems": only["problems"]}
    problems = [f"partition {p}: {problem}" for p, report in each.items() for problem in report["problems"]]
    return {"ledger_id": each[0]["ledger_id"], "agrees": not problems, "problems": problems,
            "partitions": {str(p): report for p, report in each.items()}}


async def _partition_identity(settings: Settings, conn: Any, js: Any, partition: int,
                              stream_id: bool) -> dict[str, Any]:
    """One partition's ledger id, its stream's (with `stream_id`), and the disagreements of its stream,
    projection checkpoint and subscriptions."""
    from nats.js.errors import NotFoundError

    from infra.ledger_identity import checkpoint_disagreement, ledger_identity, stream_disagreement, stream_ledger_id
    from infra.projections import PROJECTION, partition_checkpoint
    from subscriptions.store import subscriptions_disagreement

    stream = _stream_of(settings, partition)
    checkpoint = partition_checkpoint(PROJECTION, partition) if stream_id else PROJECTION
    found = [await stream_disagreement(conn, js, stream, partition),
             await checkpoint_disagreement(conn, checkpoint, partition),
             await subscriptions_disagreement(conn, partition)]
    problems = [d.message() for d in found if d is not None]
    report: dict[str, Any] = {"ledger_id": await ledger_identity(conn, partition), "agrees": not problems,
                              "problems": problems}
    if stream_id:
        try:
            report.update(stream=stream, stream_ledger_id=stream_ledger_id(await js.stream_info(stream)))
        except NotFoundError:
            report.update(stream=stream, stream_ledger_id=None, stream_missing=True)
    return report
