"""Where the servers are: explicit settings win; otherwise the servers `pamledger up`/`run` recorded.

Why apart from local_servers.launch: the SDK and the CLI's client commands read servers.json through here
and so import no server code (Postgres layout, supervisor) just to find a URL.
"""

from __future__ import annotations

from dataclasses import dataclass

from infra.settings import Settings
from pamledger_client.protocol.local import (  # the file's name and reader are the protocol's: the SDK reads it
    SERVERS_FILE as SERVERS_FILE,
    read_servers_file as read_servers_file,
)


class NoServers(RuntimeError):
    """Neither settings nor the state dir name a NATS and a Postgres."""


@dataclass(frozen=True)
class Endpoints:
    nats_url: str
    database_url: str
    source: str  # "settings" or the servers.json path


def resolve(settings: Settings) -> Endpoints:
    if settings.nats_url and settings.database_url:
        return Endpoints(settings.nats_url, settings.database_url, "settings")
    recorded = read_servers_file(settings.state_dir) or {}
    nats_url = settings.nats_url or recorded.get("nats_url")
    database_url = settings.database_url or recorded.get("database_url")
    if not nats_url or not database_url:
        raise NoServers(
            f"no servers found: run `pamledger up` (state dir {settings.state_dir}) or set "
            "PAMLEDGER_NATS_URL and PAMLEDGER_DATABASE_URL"
        )
    return Endpoints(str(nats_url), str(database_url), str(settings.state_dir / SERVERS_FILE))
