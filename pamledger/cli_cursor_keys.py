"""`pamledger cursor-keys show|rotate`: the keys that sign query cursors (query.cursor_keys).

`rotate` retires the signing key and makes a new one; cursors signed with the retired key keep working for
`query.cursor_key_grace_seconds` (default a day), then are refused as invalid_request. Running query processes
pick the new key up by themselves (they re-read the file when a cursor names a key they do not know). Query
processes on other machines need the new file copied to them (or a shared state dir). The file holds secrets:
it is written owner-only and never printed; these commands show key ids and times only.
"""

from __future__ import annotations

import argparse
import json
from typing import Any

from infra.settings import Settings
from query.cursor_keys import cursor_keys_path, describe, load_keys, rotate


def add_cursor_keys_parser(sub: Any) -> None:
    keys = sub.add_parser("cursor-keys", help="show or rotate the keys that sign query cursors (ids and times only)")
    keys.add_argument("action", choices=("show", "rotate"),
                      help="show: the keys; rotate: retire the signing key, make a new one (old cursors work for"
                           " query.cursor_key_grace_seconds more)")


def cmd_cursor_keys(settings: Settings, args: argparse.Namespace) -> int:
    path = cursor_keys_path(settings)
    grace = settings.query.cursor_key_grace_seconds
    if args.action == "rotate":
        new, keys = rotate(path, grace)
        report: dict[str, Any] = {"rotated": True, "signing_key_id": new.id}
    else:
        keys = load_keys(path)
        report = {"signing_key_id": next(k.id for k in reversed(keys) if k.retired_at is None)}
    report.update(path=str(path), grace_seconds=grace, keys=describe(keys))
    print(json.dumps(report, indent=2))
    return 0
