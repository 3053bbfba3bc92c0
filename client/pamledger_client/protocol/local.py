"""Where a local pamledger leaves what its clients need: the state dir, its servers.json and admin.token.

Why in the protocol: `pamledger up` / `make run` write these files and the SDK, the CLI and any other client
read them, so both sides name them here once. Reads only; the server writes them (local_servers.launch).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

DEFAULT_STATE_DIR = Path(".pamledger")  # relative: the folder `make run` was started in
SERVERS_FILE = "servers.json"
ADMIN_TOKEN_FILE = "admin.token"


def read_servers_file(state_dir: Path) -> dict[str, Any] | None:
    """Return what servers.json records, or None when it is absent or unreadable."""
    try:
        data = json.loads((state_dir / SERVERS_FILE).read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None
