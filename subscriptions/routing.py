"""Which partition's gateway answers a Subscribe request, in a ledger of several partitions.

Why: clients keep sending every call to `{prefix}.sub.<call>` and need not know the partition count,
while a subscription is led by its scope's partition's gateway (its feed follows that partition's stream).
Partition 0's gateway takes the public subjects, answers its own partition's requests and publishes the
others to `{prefix}.sub.p<partition>.<call>` with the reply subject and headers unchanged, so the owning
gateway checks the credential as it would have and answers the client directly (as
command_handler.router does for commands). An open goes by its scope's recorded partition (a scope not
created yet: the one its id hashes to, whose gateway answers scope_not_found); poll, ack, resume, close and
status by the partition stored with the subscription. What names neither (list, an unknown id, a request
that does not decode) is answered by partition 0's gateway, as with one partition.
"""

from __future__ import annotations

from collections.abc import Callable

import msgspec

from infra.lru import LRU
from infra.partitions import partition_of
from infra.scopes import scope_partitions
from subscriptions.store import SubscriptionStore

CACHE_SIZE = 100_000  # scopes and subscriptions whose partition is remembered (it never changes)


def partition_subscription_subject(prefix: str, partition: int, call: str) -> str:
    """Where partition `partition`'s gateway takes the Subscribe calls routed to it (service users only:
    an agent's NATS login may publish the public `{prefix}.sub.<call>` subjects alone)."""
    return f"{prefix}.sub.p{partition}.{call}"


class _Routed(msgspec.Struct):
    """The fields routing reads of any Subscribe request."""

    scope_id: str | None = None
    subscription_id: str | None = None


_routed = msgspec.json.Decoder(_Routed)


def _named(data: bytes) -> _Routed:
    try:
        return _routed.decode(data)
    except (msgspec.DecodeError, msgspec.ValidationError):
        return _Routed()


class RequestRoutes:
    """The partition of each request partition 0's gateway takes (its store's connection reads the tables)."""

    def __init__(self, store: SubscriptionStore, partitions: int, own: Callable[[str], bool]):
        self.store = store
        self.own = own  # whether a subscription id is one the routing gateway leads (no lookup needed)
        self.partitions = partitions
        self.scopes: LRU[str, int] = LRU(CACHE_SIZE)
        self.subscriptions: LRU[str, int] = LRU(CACHE_SIZE)

    async def partition_for(self, call: str, data: bytes) -> int | None:
        """The partition whose gateway answers; None: the routing gateway answers itself. Raises
        psycopg.Error when the tables cannot be read."""
        named = _named(data)
        if call == "open":
            return None if named.scope_id is None else await self._scope(named.scope_id)
        if call == "list" or named.subscription_id is None or self.own(named.subscription_id):
            return None
        return await self._subscription(named.subscription_id)

    async def _scope(self, scope_id: str) -> int:
        known = self.scopes.get(scope_id)
        if known is not None:
            return known
        recorded = (await scope_partitions(self.store.conn, [scope_id])).get(scope_id)
        if recorded is None:  # not created (yet): not remembered, so its recorded partition is read once it is
            return partition_of(scope_id, self.partitions)
        self.scopes.put(scope_id, recorded)
        return recorded

    async def _subscription(self, subscription_id: str) -> int | None:
        known = self.subscriptions.get(subscription_id)
        if known is not None:
            return known
        stored = await self.store.partition_of(subscription_id)
        if stored is not None:
            self.subscriptions.put(subscription_id, stored)
        return stored
