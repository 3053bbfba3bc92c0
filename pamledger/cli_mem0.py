"""`pamledger import --from mem0 FILE --scope SCOPE`: a Mem0 export into pamledger, through the SDK.

The whole file is read and planned first (pamledger.mem0_import: nothing is sent when any memory cannot be
mapped); then the scopes are registered and each memory's versions are sent in order (create, updates, a
delete tombstone), as the actor named on the command line (default: the one the token proves). Memories go
concurrently, their own steps one after another. Every command's idempotency key comes from the Mem0 ids,
so the same import again writes nothing and says so (`already_present`). Progress lines go to stderr.

The caller's parser supplies `file`, `--from` and `--scope`; add_mem0_arguments adds the rest.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from infra.settings import Settings
from pamledger_client.cli_common import (
    add_actor_arguments, actor_of, connect, emit_error, invalid, pam_id, print_json, progress_for,
)
from pamledger_client.client import MemoryClient
from pamledger_client.errors import PamspecError
from pamledger.cli_dispatch import client_config
from pamledger.mem0_import import ImportPlan, Mem0ExportRefused, Mem0Options, MemoryPlan, decode_export, plan_import

REPLAYED = "replayed_original_result"
PROGRESS_EVERY_SECONDS = 2.0


def add_mem0_arguments(parser: argparse.ArgumentParser, with_actor: bool = True) -> None:
    """The Mem0 import's own options (docs/mem0.md); `with_actor`: also --actor-id/--actor-kind."""
    group = parser.add_argument_group("--from mem0")
    group.add_argument("--user-scope-prefix", help="a memory with user_id U goes to scope PREFIX+U"
                                                   " (e.g. user: puts alice's memories in user:alice)")
    for name in ("user", "agent", "run"):
        group.add_argument(f"--map-{name}", action="append", default=[], metavar=f"{name.upper()}_ID=SCOPE",
                           type=_mapping, help=f"memories of this Mem0 {name}_id go to SCOPE (repeatable)")
    group.add_argument("--object-type", choices=("claim", "observation"), default="claim",
                       help="what a Mem0 memory becomes unless its metadata says (default: %(default)s)")
    group.add_argument("--scope-kind", default="workspace", help="kind of the scopes the import registers")
    group.add_argument("--concurrency", type=int, default=16, choices=range(1, 257), metavar="1-256",
                       help="memories sent at once (default: %(default)s)")
    if with_actor:
        add_actor_arguments(parser)  # who writes: --actor-id, --actor-kind


def _mapping(text: str) -> tuple[str, str]:
    mem0_id, sep, scope = text.partition("=")
    if not sep or not mem0_id:
        raise argparse.ArgumentTypeError(f"expected MEM0_ID=SCOPE, got {text!r}")
    return mem0_id, pam_id(scope)


def cmd_import_mem0(settings: Settings, args: argparse.Namespace) -> int:
    """Plan the whole file, then send it; prints the counts (exit 1 when a memory failed on the way)."""
    data = _read(args.file)
    return asyncio.run(_import(settings, args, data))


def _read(path: str) -> bytes:
    try:
        return Path(path).read_bytes() if path != "-" else sys.stdin.buffer.read()
    except OSError as exc:
        raise invalid(f"cannot read the Mem0 export {path!r}: {exc.strerror}", path=path) from None


async def _import(settings: Settings, args: argparse.Namespace, data: bytes) -> int:
    client = await connect(client_config(settings))
    try:
        actor = await actor_of(client, args)
        plan = _plan(args, data, actor)
        progress = progress_for(args, "mem0 import", "memories_done", "of", "memories")
        progress({"planned_memories": len(plan.memories), "planned_versions": plan.versions, "file": args.file,
                  "scopes": len(plan.scopes), "actor_id": actor["actor_id"]})
        for warning in plan.warnings:
            progress({"warning": warning})
        scopes = [await client.create_scope(scope, args.scope_kind) for scope in plan.scopes]
        tally = await send(client, plan, args.concurrency, progress)
        progress.finish()
    finally:
        await client.close()
    report = {"source": "mem0", "file": args.file, "shape": plan.shape, "memories": len(plan.memories),
              "scopes": [{"scope_id": s["scope_id"], "created": s.get("created", False)} for s in scopes],
              **tally.report(), "warnings": list(plan.warnings)}
    print_json(report)
    if tally.failed:
        first = tally.failed[0]
        return emit_error(PamspecError.of("invalid_request", f"{len(tally.failed)} Mem0 memories were not "
                          f"(fully) imported; the first, {first['memory_id']!r}: {first['code']}: {first['message']}",
                          {"failed": tally.failed[:20]}))
    return 0


def _plan(args: argparse.Namespace, data: bytes, actor: dict[str, str]) -> ImportPlan:
    options = Mem0Options(scope=args.scope, actor=actor, user_scope_prefix=args.user_scope_prefix,
                          map_user=dict(args.map_user), map_agent=dict(args.map_agent), map_run=dict(args.map_run),
                          object_type=args.object_type)
    try:
        return plan_import(decode_export(data), options)
    except Mem0ExportRefused as exc:
        raise invalid(f"Mem0 export {args.file!r}: {exc.message}", file=args.file, problems=exc.problems) from None


@dataclass
class Tally:
    """What the import did: objects and versions written now or found from an earlier run, and failures."""

    total: int
    objects_created: int = 0
    objects_present: int = 0
    versions_created: int = 0
    versions_present: int = 0
    deleted: int = 0
    done: int = 0
    failed: list[dict[str, Any]] = field(default_factory=list)

    def report(self) -> dict[str, Any]:
        return {"objects": {"created": self.objects_created, "already_present": self.objects_present},
                "versions": {"created": self.versions_created, "already_present": self.versions_present},
                "tombstones": self.deleted, "changed": self.versions_created > 0, "failed": self.failed}

    def line(self) -> dict[str, Any]:
        return {"memories_done": self.done, "of": self.total, "versions_written": self.versions_created,
                "versions_present": self.versions_present, "failed": len(self.failed)}


async def send(client: MemoryClient, plan: ImportPlan, concurrency: int,
               progress: Callable[[dict[str, Any]], None] = lambda _: None) -> Tally:
    """Every memory's steps in order, `concurrency` memories at once; progress on stderr."""
    tally = Tally(total=len(plan.memories))
    gate = asyncio.Semaphore(concurrency)
    last = [time.monotonic()]

    async def one(memory: MemoryPlan) -> None:
        async with gate:
            await _send_memory(client, memory, tally)
        tally.done += 1
        if time.monotonic() - last[0] >= PROGRESS_EVERY_SECONDS:
            last[0] = time.monotonic()
            progress(tally.line())

    await asyncio.gather(*(one(memory) for memory in plan.memories))
    progress(tally.line())
    return tally


async def _send_memory(client: MemoryClient, memory: MemoryPlan, tally: Tally) -> None:
    version_id: str | None = None
    for number, step in enumerate(memory.steps, start=1):
        body = dict(step.body)
        if version_id is not None:
            body["expected_version_id"] = version_id
        try:
            result = await client.command(step.command, body)
        except PamspecError as exc:
            tally.failed.append({"memory_id": memory.memory_id, "object_id": memory.object_id, "step": number,
                                 "command": step.command, "code": exc.code, "message": exc.message})
            return
        replayed = result.get("idempotency_result") == REPLAYED
        version_id = str(result["version_id"])
        if replayed:
            tally.versions_present += 1
        else:
            tally.versions_created += 1
        if step.command == "create":
            if replayed:
                tally.objects_present += 1
            else:
                tally.objects_created += 1
        elif step.command == "delete":
            tally.deleted += 1
