"""pamledger-client: the Python SDK (async and sync clients) and the client command line of pamledger.

It speaks the NATS binding only and installs alone (nats-py and msgspec): an agent's environment needs nothing
of the server. `pamledger_client.protocol` is the wire vocabulary the service itself reads (subjects, headers,
error codes, canonical JSON, value checks), so the two cannot drift apart.
"""

from pamledger_client.client import MemoryClient, SyncMemoryClient, SyncSubscription
from pamledger_client.config import ClientConfig
from pamledger_client.errors import PamspecError

__all__ = ["ClientConfig", "MemoryClient", "PamspecError", "SyncMemoryClient", "SyncSubscription"]
