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
    # The query role's read replicas: database.read_urls, else those recorded beside the recorded Postgres.
    read_urls: tuple[str, ...] = ()


def resolve(settings: Settings) -> Endpoints:
    configured = tuple(settings.database.read_urls)
    if settings.nats_url and settings.database_url:
        return Endpoints(settings.nats_url, settings.database_url, "settings", configured)
    recorded = read_servers_file(settings.state_dir) or {}
    nats_url = settings.nats_url or recorded.get("nats_url")
    database_url = settings.database_url or recorded.get("database_url")
    if not nats_url or not database_url:
        raise NoServers(
            f"no servers found: run `pamledger up` (state dir {settings.state_dir}) or set "
            "PAMLEDGER_NATS_URL and PAMLEDGER_DATABASE_URL"
        )
    replicas = recorded.get("database_read_urls") if not settings.database_url else None  # only the recorded primary's
    read_urls = configured or tuple(str(url) for url in replicas or ())
    return Endpoints(str(nats_url), str(database_url), str(settings.state_dir / SERVERS_FILE), read_urls)
