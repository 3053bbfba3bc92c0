"""The indexer's apply step: a batch of ledger events → registry rows, erasures, vectors and outbox entries.

Why split in two: embedding is slow (milliseconds per text with the model), so it happens in `prepare`,
outside the follower's transaction and in a thread; `apply_prepared` then writes, in one transaction with the
checkpoint: the registry rows of the batch, the erasures (under every space's write lock, in every space),
the vectors (never over a newer version), the moves of vectors to versions with unchanged content (a
transition), one outbox entry per (scope, space) saying what was embedded, and the catalog of current
versions a fill reads (indexer.catalog).

A version an import brought with its vector (embedding.handoff: the writer stored it with the entries, for a
space registered here with the same descriptor digest) is not embedded: that vector is written as it came,
when it was made from the version's content digest and has the space's dimensions; the outbox entry names
it under `reused`. The batch then forgets the handed-over vectors of every object it applied or erased.

What `prepare` read may change before `apply` commits: a vector written since is newer and wins
(`upsert_vectors` and `move_vectors` only move forward); content erased since has its erasure still to come
in a later batch of this very follower, which deletes what this batch wrote. The follower prepares batch
k+1 while batch k's transaction runs (infra.prepare_ahead): a move is decided on the digest a vector names,
which batch k may be replacing, so objects batch k writes or erases are embedded again, never moved; and a
batch after a registry entry is prepared only once that entry committed (see `prepare`).
"""

from __future__ import annotations

import asyncio
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

import msgspec
import psycopg
import structlog

from embedding.known import embedder_for, loaded_embedder
from embedding.store import (
    INDEX_CHECKPOINT, INDEX_NOTIFY_CHANNEL, MovedRow, SpaceRow, VectorRow, create_space, delete_object_vectors,
    keep_vectors, list_spaces, make_default, move_vectors, upsert_vectors, vector_digests,
)
from embedding.handoff import drop_handed, handed_vectors
from schemas.embedding import HandedVector
from indexer.catalog import apply_catalog
from indexer.outbox import Entry, add_entries, entry_key
from indexer.plan import DefaultSwitch, Plan, Registration, Version, plan_batch
from indexer.texts import embed, read_contents, text_of
from infra import locks
from infra.follower import Event, FollowerSpec
from infra.settings import IndexerSettings
from schemas.embedding import encode_space, decode_space

log = structlog.get_logger(__name__)


@dataclass
class Prepared:
    """What `prepare` made for one batch, keyed by its last ledger sequence."""

    plan: Plan
    spaces: list[SpaceRow]
    writes: dict[int, list[VectorRow]] = field(default_factory=dict)  # space_key → vectors
    moves: dict[int, list[MovedRow]] = field(default_factory=dict)
    textless: set[tuple[str, str]] = field(default_factory=set)  # current version has no text: no vector
    reused: dict[int, list[VectorRow]] = field(default_factory=dict)  # space_key → vectors an import handed over
    handed: dict[tuple[str, str, str], HandedVector] = field(default_factory=dict)  # (scope, object, space id)
    kept: dict[int, list[VectorRow]] = field(default_factory=dict)  # space_key → superseded versions' vectors


class IndexerStep:
    """Embeds in `prepare`, writes in `apply_prepared` (see the module docstring; the protocol is
    infra.prepare_ahead.PreparingStep)."""

    def __init__(self, settings: IndexerSettings | None = None):
        self.settings = settings or IndexerSettings()

    async def prepare(self, conn: psycopg.AsyncConnection[Any], events: list[Event],
                      pending: Prepared | None = None) -> Prepared | None:
        """Embed a batch. Ahead of a `pending` batch still being written, nothing it changes is trusted: an
        object it writes or erases is embedded rather than moved (the digest read may be the one it is
        replacing), and after a registry entry (a space created then must receive every later version
        live: indexer.rebuild) nothing is prepared ahead at all."""
        if pending is not None and pending.plan.registry:
            return None
        plan = plan_batch(events)
        prepared = Prepared(plan, await list_spaces(conn))
        unsure = set(pending.plan.versions) | pending.plan.erased if pending is not None else set()
        versions = list(plan.versions.values())
        handed = await handed_vectors(conn, sorted(set(plan.versions) | plan.erased))
        prepared.handed = {(h.scope_id, h.object_id, h.embedding_space_id): h for h in handed}
        if versions:
            await self._embed(conn, prepared, versions, unsure)
        if plan.superseded:
            await self._embed_superseded(conn, prepared)
        return prepared

    async def _embed_superseded(self, conn: psycopg.AsyncConnection[Any], prepared: Prepared) -> None:
        """Vectors of the versions a later one replaced within the batch, to keep (plan.Plan.superseded): a
        snapshot sealed while one was current searches it. Rare live (one version per object per batch is the
        rule), so embedded apart, after the current versions."""
        versions = prepared.plan.superseded
        contents = await read_contents(conn, sorted({v.version_id for v in versions}))
        texts = {v.version_id: text_of(v.object_type, contents[v.version_id])
                 for v in versions if v.version_id in contents}
        wanted = [v for v in versions if v.version_id in texts and texts[v.version_id].text]
        for space in prepared.spaces:
            embedder = loaded_embedder(space.descriptor)
            if embedder is None or not wanted:
                continue
            made = await embed(embedder, [texts[v.version_id] for v in wanted], self.settings.embed_batch)
            prepared.kept[space.space_key] = [
                VectorRow(v.scope_id, v.object_id, v.version_id, v.version_sequence, v.ledger_sequence,
                          e.truncated, e.vector, v.content_digest) for v, e in zip(wanted, made, strict=True)]

    async def _embed(self, conn: psycopg.AsyncConnection[Any], prepared: Prepared, versions: list[Version],
                     unsure: set[tuple[str, str]]) -> None:
        threads = self.settings.model_threads or None
        todo: dict[int, list[Version]] = {}
        embedders = {s.space_key: loaded_embedder(s.descriptor)
                     or await asyncio.to_thread(embedder_for, s.descriptor, threads)  # loads once
                     for s in prepared.spaces}
        for space in prepared.spaces:
            if embedders[space.space_key] is None:
                continue  # another provider's space: reported by `pamledger spaces`, never filled here
            digests = await vector_digests(conn, space, [v.key for v in versions])
            same = [v for v in versions if v.key not in unsure and v.key not in prepared.plan.erased
                    and digests.get(v.key, "") == v.content_digest]  # an erased object's vector is deleted first
            prepared.moves[space.space_key] = [MovedRow(v.scope_id, v.object_id, v.version_id, v.version_sequence,
                                                        v.ledger_sequence, v.content_digest) for v in same]
            todo[space.space_key] = [v for v in versions if v not in same]
        needed = {v.version_id for vs in todo.values() for v in vs}
        contents = await read_contents(conn, sorted(needed))
        texts = {v.version_id: text_of(v.object_type, contents[v.version_id])
                 for v in versions if v.version_id in contents}
        prepared.textless = {v.key for v in versions if v.version_id in texts and not texts[v.version_id].text}
        for space in prepared.spaces:
            wanted = [v for v in todo.get(space.space_key, []) if v.version_id in texts and texts[v.version_id].text]
            embedder = embedders[space.space_key]
            if not wanted or embedder is None:
                continue
            reused = [(v, h) for v in wanted for h in [prepared.handed.get((*v.key, space.embedding_space_id))]
                      if h is not None and _made_for(h, v, space)]
            prepared.reused[space.space_key] = [
                VectorRow(v.scope_id, v.object_id, v.version_id, v.version_sequence, v.ledger_sequence,
                          texts[v.version_id].truncated, h.vector, v.content_digest) for v, h in reused]
            taken = {v.version_id for v, _ in reused}
            wanted = [v for v in wanted if v.version_id not in taken]
            if not wanted:
                continue
            made = await embed(embedder, [texts[v.version_id] for v in wanted], self.settings.embed_batch)
            prepared.writes[space.space_key] = [
                VectorRow(v.scope_id, v.object_id, v.version_id, v.version_sequence, v.ledger_sequence,
                          e.truncated, e.vector, v.content_digest) for v, e in zip(wanted, made, strict=True)]

    async def apply_prepared(self, conn: psycopg.AsyncConnection[Any], events: list[Event],
                             prepared: Prepared) -> None:
        if prepared.plan.through_sequence != events[-1][0] or prepared.plan.from_sequence != events[0][0]:
            raise RuntimeError("indexer: apply called with what was prepared for other events")
        plan = prepared.plan
        spaces = list(prepared.spaces)
        for item in plan.registry:
            created = await _registry(conn, item)
            if created is not None:
                spaces.append(created)
        gone = sorted(plan.erased | prepared.textless)
        if gone:
            for space in sorted(spaces, key=lambda s: s.space_key):  # one order: no deadlock with fills
                await conn.execute("SELECT pg_advisory_xact_lock(%s)", (locks.space_write_key(space.space_key),))
            await delete_object_vectors(conn, spaces, sorted(prepared.textless - plan.erased))
            await delete_object_vectors(conn, spaces, sorted(plan.erased), kept=True)  # erasure reaches kept ones
        entries: list[Entry] = []
        for space in prepared.spaces:
            await move_vectors(conn, space, prepared.moves.get(space.space_key, []))
            rows, reused = prepared.writes.get(space.space_key, []), prepared.reused.get(space.space_key, [])
            await upsert_vectors(conn, space, rows + reused)
            await keep_vectors(conn, space, prepared.kept.get(space.space_key, []))
            entries.extend(generated_entries(space, rows, plan.from_sequence, plan.through_sequence, reused))
        if prepared.handed:
            held = {(h.scope_id, h.object_id) for h in prepared.handed.values()}
            await drop_handed(conn, [(v.scope_id, v.object_id, v.version_sequence) for v in plan.versions.values()
                                     if v.key in held], [key for key in gone if key in held])
        await add_entries(conn, entries)
        await apply_catalog(conn, plan)


async def _registry(conn: psycopg.AsyncConnection[Any], item: Registration | DefaultSwitch) -> SpaceRow | None:
    """Project one registry entry; returns a space it created. A descriptor this build cannot read (the writer
    checked it, so only a newer writer's) is logged and left out rather than wedging the indexer."""
    if isinstance(item, DefaultSwitch):
        if not await make_default(conn, item.embedding_space_id, item.ledger_sequence):
            log.warning("indexer.default_of_unknown_space", embedding_space_id=item.embedding_space_id,
                        ledger_sequence=item.ledger_sequence)
        return None
    try:
        space = decode_space(msgspec.json.encode(item.embedding_space))
    except (msgspec.ValidationError, msgspec.DecodeError) as exc:
        log.error("indexer.unreadable_space", ledger_sequence=item.ledger_sequence, reason=str(exc))
        return None
    return await create_space(conn, space, encode_space(space), item.space_digest, item.ledger_sequence)


def _made_for(handed: HandedVector, version: Version, space: SpaceRow) -> bool:
    """Whether a handed-over vector is this version's in this space: same content, same space, right size."""
    return (handed.space_digest == space.space_digest and handed.content_digest == version.content_digest
            and len(handed.vector) == space.dimensions)


def generated_entries(space: SpaceRow, rows: list[VectorRow], from_sequence: int,
                      through_sequence: int, reused: list[VectorRow] | None = None) -> list[Entry]:
    """One `embedding_generated` entry per scope for what this batch embedded in `space` (`items`) and
    stored as an import handed it over (`reused`, left out when none)."""
    by_scope: dict[str, list[list[str]]] = defaultdict(list)
    taken: dict[str, list[list[str]]] = defaultdict(list)
    for row in rows:
        by_scope[row.scope_id].append([row.object_id, row.version_id])
    for row in reused or ():
        taken[row.scope_id].append([row.object_id, row.version_id])
    return [Entry(scope, "embedding_generated", entry_key("emb", space.space_key, through_sequence, scope), {
        "embedding_space_id": space.embedding_space_id, "space_digest": space.space_digest,
        "count": len(by_scope[scope]), "items": by_scope[scope], "from_ledger_sequence": from_sequence,
        "through_ledger_sequence": through_sequence, **({"reused": taken[scope]} if taken[scope] else {}),
    }) for scope in sorted(set(by_scope) | set(taken))]


def indexer_spec(settings: IndexerSettings | None = None, batch: int = 64) -> FollowerSpec:
    """The indexer follower with these settings (the composition root passes the process's own)."""
    return FollowerSpec(name="indexer", checkpoint=INDEX_CHECKPOINT, notify_channel=INDEX_NOTIFY_CHANNEL,
                        lock_base=locks.INDEXER_BASE, step=lambda: IndexerStep(settings), batch=batch)


INDEXER = indexer_spec()
