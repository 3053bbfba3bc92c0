"""The load: workers writing and reading through the SDK, and push subscriptions recording what they get.

Every write carries an idempotency key of its own and is retried with it while the service is away
(service_unavailable, a timeout, a lost connection), so a write whose reply was lost is not made twice. A write
counts as acknowledged only when a reply said so; the audit then reads each one back at its version. Each
worker owns its objects (no two workers race on one), so a version conflict is a finding, not noise.
"""

from __future__ import annotations

import asyncio
import random
import time
import uuid
from collections import Counter
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from pamledger_client.client import MemoryClient, PamspecError

RETRYABLE = ("service_unavailable", "duplicate_operation")  # plus any failure that is not an envelope
WRITE_DEADLINE = 180.0  # a write is retried this long before it is given up (counted, never acknowledged)
OPERATIONS = {"create": 30, "update": 18, "transition": 8, "relate": 10, "redact": 6, "query": 14, "search": 14}
WRITES = ("create", "update", "transition", "relate", "redact")
EVENT_FILTERS: tuple[dict[str, Any], ...] = ({}, {"event_classes": ["object_created", "object_updated"]})


def code_of(exc: BaseException) -> str:
    """A PAMSPEC error's code, else the exception's type (a NATS timeout, a lost connection)."""
    return exc.code if isinstance(exc, PamspecError) else type(exc).__name__


@dataclass
class Acked:
    kind: str
    scope_id: str
    object_id: str
    version_id: str


@dataclass
class Watched:
    """One push subscription and what it handed out, in order."""

    scope_id: str
    filter: dict[str, Any]
    subscription_id: str = ""
    start_sequence: int = 0
    received: list[int] = field(default_factory=list)
    open_failed: bool = False


@dataclass
class Record:
    """What the clients saw: acknowledged writes, erased canaries, errors by operation and code."""

    acked: list[Acked] = field(default_factory=list)
    canaries: dict[str, str] = field(default_factory=dict)  # word -> object id, once its erasure is acknowledged
    operations: Counter[str] = field(default_factory=Counter)  # acknowledged writes / answered reads by kind
    given_up: Counter[str] = field(default_factory=Counter)  # writes never acknowledged
    errors: Counter[tuple[str, str]] = field(default_factory=Counter)  # (operation, code) -> count
    watched: list[Watched] = field(default_factory=list)


@dataclass
class Live:
    """A worker's objects: the current version of each, and the canary objects waiting for their erasure."""

    versions: dict[str, str] = field(default_factory=dict)
    corroborated: set[str] = field(default_factory=set)
    canaries: dict[str, tuple[str, str]] = field(default_factory=dict)  # word -> (object id, version id)


async def acknowledged(record: Record, kind: str, call: Callable[[str], Awaitable[Mapping[str, Any]]]
                       ) -> Mapping[str, Any] | None:
    """`call(idempotency_key)` until a reply says it is done (one key for every try), else None."""
    key, give_up = f"soak:{uuid.uuid4()}", time.monotonic() + WRITE_DEADLINE
    while True:
        try:
            result = await call(key)
        except Exception as exc:  # noqa: BLE001 - every failure is counted; only a retryable one is retried
            code = code_of(exc)
            record.errors[(kind, code)] += 1
            if (isinstance(exc, PamspecError) and code not in RETRYABLE) or time.monotonic() > give_up:
                record.given_up[kind] += 1
                return None
            await asyncio.sleep(0.5)
            continue
        record.operations[kind] += 1
        return result


class Worker:
    """One client writing and reading in one scope until told to stop (it finishes the write in hand)."""

    def __init__(self, name: str, client: MemoryClient, scope_id: str, actor: dict[str, Any], record: Record,
                 rng: random.Random):
        self.name, self.client, self.scope_id, self.actor = name, client, scope_id, actor
        self.record, self.rng, self.live, self.count = record, rng, Live(), 0
        self.provenance = {"provenance_id": f"prov:soak:{name}", "actor": actor, "activity": "soak"}

    async def run(self, stop: asyncio.Event) -> None:
        kinds, weights = list(OPERATIONS), list(OPERATIONS.values())
        while not stop.is_set():
            kind = self.rng.choices(kinds, weights)[0]
            await getattr(self, kind)()

    def _ack(self, kind: str, result: Mapping[str, Any] | None, object_key: str = "object_id") -> Mapping[str, Any] | None:
        if result is not None:
            self.record.acked.append(Acked(kind, self.scope_id, result[object_key], result["version_id"]))
        return result

    async def create(self) -> None:
        self.count += 1
        canary = self.rng.random() < 0.3
        word = f"zqcanary{uuid.uuid4().hex}x" if canary else ""
        text = f"secret {word}" if canary else f"soak note {self.name} {self.count} {self.rng.choice(TOPICS)}"
        result = self._ack("create", await acknowledged(self.record, "create", lambda key: self.client.create(
            self.scope_id, "observation", {"text": text}, self.actor, self.provenance, idempotency_key=key)))
        if result is None:
            return
        if canary:
            self.live.canaries[word] = (result["object_id"], result["version_id"])
        else:
            self.live.versions[result["object_id"]] = result["version_id"]

    def _pick(self) -> tuple[str, str] | None:
        if not self.live.versions:
            return None
        object_id = self.rng.choice(list(self.live.versions))
        return object_id, self.live.versions[object_id]

    def _moved(self, object_id: str, result: Mapping[str, Any] | None) -> None:
        """The object's next version, or (never acknowledged) forget it: its version is not known."""
        if result is None:
            self.live.versions.pop(object_id, None)
        else:
            self.live.versions[object_id] = result["version_id"]

    async def update(self) -> None:
        if (picked := self._pick()) is None:
            return await self.create()
        object_id, version_id = picked
        text = f"soak note {self.name} updated {self.rng.choice(TOPICS)}"
        self._moved(object_id, self._ack("update", await acknowledged(self.record, "update", lambda key:
            self.client.update(self.scope_id, object_id, version_id, {"text": text}, self.actor, self.provenance,
                               idempotency_key=key))))

    async def transition(self) -> None:
        candidates = [o for o in self.live.versions if o not in self.live.corroborated]
        if not candidates:
            return await self.create()
        object_id = self.rng.choice(candidates)
        version_id = self.live.versions[object_id]
        result = self._ack("transition", await acknowledged(self.record, "transition", lambda key:
            self.client.transition(self.scope_id, object_id, version_id, "validation", "corroborated", self.actor,
                                   self.provenance, idempotency_key=key)))
        self._moved(object_id, result)
        if result is not None:
            self.live.corroborated.add(object_id)

    async def relate(self) -> None:
        if len(self.live.versions) < 2:
            return await self.create()
        source, target = self.rng.sample(sorted(self.live.versions), 2)
        self._ack("relate", await acknowledged(self.record, "relate", lambda key: self.client.relate(
            self.scope_id, source, target, "supports", self.actor, self.provenance, idempotency_key=key)),
            "relationship_id")

    async def redact(self) -> None:
        """Erase a canary object's content: its word must then be nowhere (audit)."""
        if not self.live.canaries:
            return await self.create()
        word = self.rng.choice(list(self.live.canaries))
        object_id, version_id = self.live.canaries.pop(word)
        result = self._ack("redact", await acknowledged(self.record, "redact", lambda key: self.client.redact(
            self.scope_id, object_id, version_id, self.actor, self.provenance, "soak:erasure", erase=True,
            idempotency_key=key)))
        if result is not None:
            self.record.canaries[word] = object_id

    async def _read(self, kind: str, call: Awaitable[Any]) -> None:
        try:
            await call
        except Exception as exc:  # noqa: BLE001 - counted by code; a read is not retried
            self.record.errors[(kind, code_of(exc))] += 1
            await asyncio.sleep(0.2)
        else:
            self.record.operations[kind] += 1

    async def query(self) -> None:
        await self._read("query", self.client.query(self.scope_id, limit=20))

    async def search(self) -> None:
        mode = self.rng.choice(("lexical", "lexical", "semantic", "hybrid"))
        await self._read("search", self.client.search(self.scope_id, text=self.rng.choice(TOPICS), mode=mode,
                                                      limit=5, wait_ms=2000))


TOPICS = ("harbour crane", "orbital mechanics", "sourdough starter", "violin varnish", "glacier melt",
          "tax ledger", "bird migration", "compiler passes")


async def watch(client: MemoryClient, watched: Watched, actor: dict[str, Any], record: Record) -> None:
    """Open one push subscription (retrying) and record every event it hands out, riding out restarts: the
    SDK re-attaches itself; an error from a re-attach is counted and the iteration goes on."""
    while True:
        try:
            sub = await client.subscribe(watched.scope_id, actor, filter=watched.filter)
            break
        except Exception as exc:  # noqa: BLE001 - the gateway is away: try again
            record.errors[("subscribe", code_of(exc))] += 1
            await asyncio.sleep(0.5)
    watched.subscription_id, watched.start_sequence = sub.subscription_id, sub.last_sequence
    while sub.closed is None:
        try:
            async for event in sub:
                watched.received.append(int(event["ledger_sequence"]))
        except Exception as exc:  # noqa: BLE001 - a failed re-attach: the next iteration re-attaches again
            record.errors[("subscribe", code_of(exc))] += 1
            await asyncio.sleep(0.5)
    record.errors[("subscribe", f"closed:{sub.closed.get('reason')}")] += 1
