"""Where a request's SQL runs: anything that hands out a connection for a block (a pool, or query.replicas).

Why a Protocol: the query role's scans take their connection from the primary's pool or, with read replicas
configured, from `query.replicas.ReplicaReads`, which picks a replica that has caught up or else the primary.
The code that runs a query needs only `connection()` and must not care which.
"""

from __future__ import annotations

from contextlib import AbstractAsyncContextManager
from typing import Any, Protocol

import psycopg


class Connections(Protocol):
    """A source of connections in autocommit mode, each lent for one `async with` block."""

    def connection(self, timeout: float | None = None) -> AbstractAsyncContextManager[psycopg.AsyncConnection[Any]]:
        ...
