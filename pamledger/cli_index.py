"""`pamledger spaces | index rebuild | index set-default`: the operator's view of Embedding Spaces and the two
explicit steps on them (fill a space, switch the default).

Why here (the composition root): they talk to the writer over NATS (registrations and the default switch
are ledger entries) and fill a space in this process with the indexer's own code, while the service keeps
serving searches from the old default.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
import uuid
from typing import Any

import psycopg

from authz.operator import require_operator
from embedding.store import SpaceRow, find_space
from infra.endpoints import resolve
from infra.settings import Settings
from pamledger_client.cli_common import invalid, progress_for
from pamledger_client.errors import PamspecError

WAIT_SECONDS = 60.0


def add_index_parsers(sub: Any) -> None:
    sub.add_parser("spaces", help="registered Embedding Spaces: descriptor, state, default, vector, stale and"
                                  " missing counts, the indexer's checkpoint and backlog")
    index = sub.add_parser("index", help="fill a space from the current versions, or switch the default space")
    actions = index.add_subparsers(dest="index_action", required=True)
    rebuild = actions.add_parser("rebuild", help="register the space if needed, then fill it here from the"
                                                 " current versions (progress on stderr); the default keeps serving")
    which = rebuild.add_mutually_exclusive_group(required=True)
    which.add_argument("--space", help="a registered embedding_space_id")
    which.add_argument("--model", help="minilm | hashing-N: register this build's space for it, then fill it")
    default = actions.add_parser("set-default", help="make a registered, filled space the default (a ledger entry)")
    default.add_argument("space", help="the embedding_space_id")
    default.add_argument("--force", action="store_true", help="even while the space is still filling")


def cmd_spaces(settings: Settings, args: argparse.Namespace) -> int:
    from indexer.report import spaces_report

    async def run() -> dict[str, Any]:
        await require_operator(settings, resolve(settings).database_url)
        async with await psycopg.AsyncConnection.connect(resolve(settings).database_url, autocommit=True) as conn:
            return await spaces_report(conn, settings.partition)

    print(json.dumps(asyncio.run(run()), indent=2, sort_keys=True))
    return 0


def cmd_index(settings: Settings, args: argparse.Namespace) -> int:
    asyncio.run(require_operator(settings, resolve(settings).database_url))
    runner = _rebuild if args.index_action == "rebuild" else _set_default
    print(json.dumps(asyncio.run(runner(settings, args)), indent=2, sort_keys=True))
    return 0


async def _requester(settings: Settings, nats_url: str) -> Any:
    from authz.bootstrap import service_token
    from infra.requester import CommandRequester
    from pamledger.runtime import connect_nats

    # An operator's tool on the service's host (it reads the database directly): it sends what the indexer
    # sends, with the service credential of the state dir.
    token = service_token(settings)
    nc = await connect_nats(nats_url, "pamledger-cli-index", settings)
    return nc, CommandRequester(nc, settings.subject_prefix, timeout=settings.request_timeout_seconds, retries=3,
                                token=token)


async def _projected(conn: psycopg.AsyncConnection[Any], space_id: str, ok: Any = lambda s: True) -> SpaceRow:
    """The space's registry row once the indexer projected it (and `ok(row)`), or service_unavailable."""
    deadline = time.monotonic() + WAIT_SECONDS
    while True:
        space = await find_space(conn, space_id)
        if space is not None and ok(space):
            return space
        if time.monotonic() > deadline:
            raise PamspecError.of("service_unavailable", "the indexer has not projected this space's entry"
                                  " (is the indexer role running?)", {"embedding_space_id": space_id})
        await asyncio.sleep(0.1)


async def _rebuild(settings: Settings, args: argparse.Namespace) -> dict[str, Any]:
    from indexer.rebuild import FillBusy, fill_space
    from indexer.role import register_space, usable_embedder
    from embedding.known import descriptor_for

    descriptor = None
    if args.model is not None:  # checked before any server is looked for
        try:
            descriptor = descriptor_for(args.model)
        except ValueError as exc:
            raise invalid(str(exc), model=args.model) from None
    endpoints = resolve(settings)
    async with await psycopg.AsyncConnection.connect(endpoints.database_url, autocommit=True) as conn:
        if descriptor is not None:
            nc, requester = await _requester(settings, endpoints.nats_url)
            try:
                await register_space(requester, descriptor)
            finally:
                await nc.close()
            space_id = descriptor.embedding_space_id
        else:
            space_id = args.space
            if await find_space(conn, space_id) is None:
                raise invalid("no such embedding space is registered", embedding_space_id=space_id)
        space = await _projected(conn, space_id)
        embedder = await usable_embedder(space, settings.indexer.model_threads or None)
        if embedder is None:
            raise invalid("this build has no embedder for this space (another provider or descriptor)",
                          embedding_space_id=space_id)
        progress = progress_for(args, "index rebuild", "done", "total", "objects")
        while True:
            try:
                report = await fill_space(conn, space, embedder, settings.indexer.rebuild_batch, lambda p: progress(
                    {"done": p.done, "total": p.total, "embedded": p.embedded, "seconds": round(p.seconds, 1)}))
                break
            except FillBusy:  # the indexer role is filling it: wait, then pass over what it left (cheap)
                progress.note("another process is filling this space; waiting for it")
                await asyncio.sleep(0.5)
        progress.finish()
        return {"embedding_space_id": report.embedding_space_id, "state": "ready", "objects": report.total,
                "embedded": report.embedded, "filled_sequence": report.filled_sequence,
                "seconds": round(report.seconds, 3)}


async def _set_default(settings: Settings, args: argparse.Namespace) -> dict[str, Any]:
    from indexer.role import set_default

    endpoints = resolve(settings)
    async with await psycopg.AsyncConnection.connect(endpoints.database_url, autocommit=True) as conn:
        space = await find_space(conn, args.space)
        if space is None:
            raise invalid("no such embedding space is registered", embedding_space_id=args.space)
        if space.state != "ready" and not args.force:
            raise invalid("the space is still filling: searches in it would miss objects (--force to switch"
                          " anyway)", embedding_space_id=args.space, state=space.state)
        nc, requester = await _requester(settings, endpoints.nats_url)
        try:
            result = await set_default(requester, args.space, f"default-space:{args.space}:{uuid.uuid4()}")
        finally:
            await nc.close()
        space = await _projected(conn, args.space, lambda s: s.is_default)
        return {"embedding_space_id": space.embedding_space_id, "default": True,
                "default_sequence": space.default_sequence, "ledger_sequence": result.get("ledger_sequence")}
