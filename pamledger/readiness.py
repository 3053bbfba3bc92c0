"""`run` says it serves only once every role answers: a request sent after `"serving": true` finds a responder.

Why: `run` printed `"serving": true` as soon as it had spawned the roles, seconds before they subscribed, so a
`create` sent then failed with NoRespondersError. Now `run` prints `"starting"` at once and `"serving"` when
every role it runs has answered its status request; a role still silent after `warn_seconds` is named in a
`"waiting_for"` line (once), and the wait goes on. The wait runs in a thread of its own, beside the
supervisor (or the single-process service) that owns the main thread.
"""

from __future__ import annotations

import asyncio
import json
import sys
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

from infra.settings import Settings

POLL_SECONDS = 0.25


def announce_when_ready(settings: Settings, roles: Sequence[str], line: dict[str, Any],
                        warn_seconds: float = 60.0, say: Callable[[dict[str, Any]], None] | None = None,
                        ) -> threading.Thread:
    """Print `{"serving": false, "starting": true, ...line}` now and `{"serving": true, ...line}` once every role
    answers (from a daemon thread, so it never holds the process up)."""
    out = say or _stderr_line
    out({"serving": False, "starting": True, **line})
    thread = threading.Thread(target=lambda: asyncio.run(wait_until_ready(settings, roles, line, warn_seconds, out)),
                              name="pamledger-readiness", daemon=True)
    thread.start()
    return thread


async def wait_until_ready(settings: Settings, roles: Sequence[str], line: dict[str, Any], warn_seconds: float,
                           say: Callable[[dict[str, Any]], None]) -> None:
    from pamledger_client.client import MemoryClient
    from pamledger.cli_dispatch import client_config
    from pamledger_client.connection import open_nats
    from pamledger.nats_users import operator_nats_options

    assert settings.nats_url is not None
    started, warned = time.monotonic(), False
    client: MemoryClient | None = None
    while True:
        try:
            if client is None:
                nc = await open_nats(settings.nats_url, 2.0, login=operator_nats_options(settings))
                # the admin token from the state dir (auth enforced: status answers authenticated callers)
                client = MemoryClient(nc, settings.subject_prefix, 2.0, retries=0, token=client_config(settings).find_token())
            waiting = silent(roles, await asyncio.gather(*(_answers(client, role) for role in roles)))
        except Exception:  # noqa: BLE001 - NATS not there yet: everything is still waiting
            waiting, client = list(roles), None
        if not waiting and client is not None:
            say({"serving": True, **line})
            await client.nc.close()
            return
        if not warned and time.monotonic() - started > warn_seconds:
            say({"serving": False, "waiting_for": waiting, "seconds": round(time.monotonic() - started)})
            warned = True
        await asyncio.sleep(POLL_SECONDS)


def silent(roles: Sequence[str], answered: Sequence[bool]) -> list[str]:
    """The roles that did not answer, in the order asked."""
    return [role for role, ok in zip(roles, answered, strict=True) if not ok]


async def _answers(client: Any, role: str) -> bool:
    from pamledger_client.errors import PamspecError

    try:
        await client.status(role)
        return True
    except PamspecError as exc:  # a refusal is an answer too: the role is subscribed (no token found here)
        return exc.code == "access_denied"


def _stderr_line(line: dict[str, Any]) -> None:
    print(json.dumps(line), file=sys.stderr, flush=True)
