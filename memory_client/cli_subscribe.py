"""`pamledger subscribe`: a tail -f of a scope's ledger, one JSON line per event, until Ctrl-C."""

from __future__ import annotations

import argparse
import asyncio
import json
import signal
import sys
from typing import Any

from infra.endpoints import resolve
from infra.settings import Settings
from infra.tasks import stop_task
from memory_client.client import MemoryClient, PamspecError


def add_subscribe_parser(sub: Any) -> None:
    s = sub.add_parser("subscribe", help="stream a scope's ledger events as JSON lines (Ctrl-C stops)")
    s.add_argument("scope_id")
    s.add_argument("--after", type=int, dest="after_sequence", help="catch up from after this ledger sequence")
    s.add_argument("--event-class", action="append", dest="event_classes")
    s.add_argument("--object-type")
    s.add_argument("--object-id")
    s.add_argument("--subscription-id", help="re-attach to an existing subscription")
    s.add_argument("--actor-id", default="actor:cli:user")
    s.add_argument("--actor-kind", default="human")
    s.add_argument("--close-on-exit", action="store_true", help="unsubscribe when stopped (default: keep it)")


def cmd_subscribe(settings: Settings, args: argparse.Namespace) -> int:
    try:
        asyncio.run(_tail(settings, args))
    except PamspecError as exc:
        print(json.dumps({"error": {"code": exc.code, "message": exc.message, "details": exc.details}}))
        return 1
    return 0


async def _tail(settings: Settings, args: argparse.Namespace) -> None:
    client = await MemoryClient.connect(resolve(settings).nats_url, settings.subject_prefix,
                                        settings.request_timeout_seconds)
    flt = {k: v for k, v in (("event_classes", args.event_classes), ("object_type", args.object_type),
                             ("object_id", args.object_id)) if v}
    actor = {"actor_id": args.actor_id, "actor_kind": args.actor_kind}
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
    if args.close_on_exit and sub.closed is None:
        await sub.close()
    await client.close()
