"""`export` and `import`: a scope to a bundle file and back (pamledger.bundle; the format: schemas.bundle).

Progress goes to stderr as JSON lines, the result to stdout as JSON, like every command.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
from pathlib import Path
from typing import Any

from infra.settings import Settings
from pamledger.bundle import export_bundle, import_bundle
from pamledger.cli_dispatch import client_config
from pamledger_client.cli_common import actor_of, add_actor_arguments, connect, invalid, pam_id, print_json, progress_for


def add_bundle_parsers(sub: Any, import_sources: tuple[str, ...] = ("pamledger",)) -> argparse.ArgumentParser:
    """`export` and `import`; returns the import parser (the composition root adds --from mem0's options)."""
    export = sub.add_parser("export", help="write a scope's memory and ledger entries to a bundle (JSON Lines);"
                                           " needs read and inspect_history on the scope")
    export.add_argument("scope_id", type=pam_id)
    export.add_argument("--out", help="the bundle file (default: stdout); written whole or not at all")
    export.add_argument("--at", type=int, default=None, dest="at_sequence",
                        help="the ledger sequence to export up to (default: the head)")
    export.add_argument("--vectors", action="store_true",
                        help="also each shown version's vectors, with their Embedding Space and its digest")
    export.add_argument("--quiet", action="store_true", help="no progress on stderr")
    imp: argparse.ArgumentParser = sub.add_parser("import", help="replay a bundle into a new or empty scope (an administrator's);"
                                        " importing it again changes nothing")
    imp.add_argument("file", help="the bundle")
    imp.add_argument("--scope", type=pam_id, help="import into this scope id instead of the bundle's own")
    imp.add_argument("--map-scope", action="append", default=[], metavar="A=B",
                     help="map scope A of the bundle (e.g. a relationship's target scope) to B; repeatable")
    imp.add_argument("--from", dest="source", choices=import_sources, default="pamledger",
                     help="what wrote FILE: a pamledger bundle (default), or another system's export"
                          " (mem0: docs/mem0.md, needs --scope)")
    imp.add_argument("--quiet", action="store_true", help="no progress on stderr")
    add_actor_arguments(imp)
    return imp


def cmd_export(settings: Settings, args: argparse.Namespace) -> int:
    progress = progress_for(args, "export", "ledger_sequence", "watermark")

    async def run() -> dict[str, Any]:
        client = await connect(client_config(settings))
        try:
            if args.out is None:
                return await export_bundle(client, args.scope_id, sys.stdout.buffer, args.at_sequence,
                                           progress, vectors=args.vectors)
            out = Path(args.out)
            partial = out.with_name(out.name + ".partial")
            with partial.open("wb") as handle:
                summary = await export_bundle(client, args.scope_id, handle, args.at_sequence, progress,
                                              vectors=args.vectors)
                handle.flush()
                os.fsync(handle.fileno())
            partial.replace(out)  # a bundle appears whole or not at all
            return {**summary, "out": str(out)}
        finally:
            await client.close()

    summary = asyncio.run(run())
    progress.finish()
    if args.out is None:
        print(json.dumps({"exported": summary}, sort_keys=True), file=sys.stderr)
    else:
        print_json(summary)
    return 0


def cmd_import(settings: Settings, args: argparse.Namespace) -> int:
    mapping = {}
    for pair in args.map_scope:
        source, sep, target = pair.partition("=")
        if not sep:
            raise invalid("--map-scope takes SOURCE=TARGET", value=pair)
        mapping[pam_id(source)] = pam_id(target)
    path = Path(args.file)
    if not path.is_file():
        raise invalid("no such bundle file", file=str(path))

    progress = progress_for(args, "import", "imported_entries", "of", "entries")

    async def run() -> dict[str, Any]:
        client = await connect(client_config(settings))
        try:
            actor = await actor_of(client, args)
            return await import_bundle(client, path, actor, args.scope, mapping, progress)
        finally:
            await client.close()
            progress.finish()

    print_json(asyncio.run(run()))
    return 0
