"""`pamledger subscribe`: a tail -f of a scope's ledger, one JSON line per event, until Ctrl-C (which closes
the subscription unless `--keep`). `pamledger subscriptions [--all] [--close ID]` lists and closes the caller's
subscriptions (an administrator's: everyone's) through the gateway's `sub.list` and `sub.close`."""

from __future__ import annotations

import argparse
import asyncio
import json
import signal
import sys
from typing import Any

from pamledger_client.config import ClientConfig
from pamledger_client.protocol.tasks import stop_task
from pamledger_client.cli_common import actor_of, add_actor_arguments, connect, pam_id, print_json, sequence


def add_subscribe_parser(sub: Any) -> None:
    s = sub.add_parser("subscribe", help="stream a scope's ledger events as JSON lines (Ctrl-C stops and "
                                         "closes the subscription unless --keep)")
    s.add_argument("scope_id", type=pam_id)
    s.add_argument("--after", type=sequence, dest="after_sequence", help="catch up from after this ledger sequence")
    s.add_argument("--event-class", action="append", dest="event_classes", help="repeatable; filters event classes")
    s.add_argument("--object-type")
    s.add_argument("--object-id", type=pam_id)
    s.add_argument("--subscription-id", type=pam_id, help="re-attach to an existing subscription")
    add_actor_arguments(s)
    s.add_argument("--keep", action="store_true",
                   help="leave the subscription open when stopped (re-attach with --subscription-id)")
    s.add_argument("--close-on-exit", action="store_true", help=argparse.SUPPRESS)  # the default now
    ls = sub.add_parser("subscriptions", help="list your open subscriptions (an administrator's token: everyone's;"
                                              " --all: closed ones too); --close ID")
    ls.add_argument("--all", action="store_true", help="closed subscriptions too")
    ls.add_argument("--close", metavar="SUBSCRIPTION_ID", action="append", type=pam_id, help="close it (repeatable)")


def cmd_subscribe(config: ClientConfig, args: argparse.Namespace) -> int:
    asyncio.run(_tail(config, args))  # errors: main() prints the envelope
    return 0


async def _tail(config: ClientConfig, args: argparse.Namespace) -> None:
    client = await connect(config)
    try:
        flt = {k: v for k, v in (("event_classes", args.event_classes), ("object_type", args.object_type),
                                 ("object_id", args.object_id)) if v}
        actor = await actor_of(client, args)
        sub = await client.subscribe(args.scope_id, actor, after_sequence=args.after_sequence, filter=flt,
                                     subscription_id=args.subscription_id)
        print(json.dumps({"subscription_id": sub.subscription_id}), file=sys.stderr, flush=True)
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)

        async def pump() -> None:
            async for event in sub:
                print(json.dumps(event, sort_keys=True), flush=True)
            if sub.closed:
                print(json.dumps({"closed": sub.closed}, sort_keys=True), flush=True)

        task = asyncio.create_task(pump())
        await asyncio.wait([task, asyncio.create_task(stop.wait())], return_when=asyncio.FIRST_COMPLETED)
        await stop_task(task)
        if not args.keep and sub.closed is None:
            closed = await sub.close()
            print(json.dumps({"closed": closed}, sort_keys=True), file=sys.stderr, flush=True)
    finally:
        await client.close()


def cmd_subscriptions(config: ClientConfig, args: argparse.Namespace) -> int:
    if args.close:
        print_json({"closed": asyncio.run(_close(config, args.close))})
        return 0
    print_json(asyncio.run(_list(config, args.all)))
    return 0


async def _list(config: ClientConfig, everything: bool) -> dict[str, Any]:
    """Through the gateway's `sub.list`: the caller's own subscriptions, everyone's for an administrator
    ({"subscriptions": [...], "truncated": bool}: the oldest 2000 at most)."""
    client = await connect(config)
    try:
        return await client.subscription_request("list", {"all": everything, "limit": 2000})
    finally:
        await client.close()


async def _close(config: ClientConfig, ids: list[str]) -> list[dict[str, Any]]:
    """Close through the gateway (it stops delivery and records subscription_closed)."""
    client = await connect(config)
    try:
        return [await client.subscription_request("close", {"subscription_id": i, "reason": "unsubscribed"})
                for i in ids]
    finally:
        await client.close()
