"""The one place search tests get vectors from: a stand-in for the indexer follower.

Why one function: until the indexer lands, search tests write vectors with the kernel's real store
functions (create_space, upsert_vectors, the index checkpoint and its NOTIFY) from the real projection rows
and the real preprocessing profile; after the merge this becomes "wait for the indexer" in one place.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import psycopg

from embedding.embedders import Embedder
from embedding.store import (
    INDEX_CHECKPOINT, INDEX_NOTIFY_CHANNEL, SpaceRow, VectorRow, create_space, find_space, upsert_vectors,
)
from embedding.text_profile import prepare
from infra.projections import PROJECTION, advance_checkpoint, checkpoint, notify_checkpoint
from schemas.canonical import decode_json
from schemas.embedding import EmbeddingSpace, encode_space, space_digest
from tests.conftest import Env, wait_for

_CURRENT = (
    "SELECT p.object_id, p.version_id, p.sequence, p.ledger_sequence, p.object_type, c.content"
    " FROM current_objects p LEFT JOIN content_store c ON c.content_digest = p.content_digest"
    " WHERE p.scope_id = %s AND (%s::text[] IS NULL OR p.object_id = ANY(%s))"
)


async def write_vectors(env: Env, space: EmbeddingSpace, scope_id: str, embedder: Embedder | None = None,
                        vectors: dict[str, Sequence[float]] | None = None, objects: list[str] | None = None,
                        default: bool = True, state: str = "ready", through: int | None = None) -> SpaceRow:
    """Register `space` (once), vector the scope's current objects (`objects` only, when given) with
    `embedder` over the profile's text or with the given `vectors` by object id, and move the index
    checkpoint to `through` (default: the projection's checkpoint) with its NOTIFY, in one transaction."""
    await wait_for(lambda: _projected(env), timeout=60)
    async with await psycopg.AsyncConnection.connect(env.database_url) as conn:
        row = await find_space(conn, space.embedding_space_id)
        if row is None:
            row = await create_space(conn, space, encode_space(space), space_digest(space), 0)
            assert row is not None
        if default:
            await conn.execute("UPDATE embedding_spaces SET is_default = false WHERE embedding_space_id <> %s",
                               (space.embedding_space_id,))
            await conn.execute("UPDATE embedding_spaces SET is_default = true WHERE embedding_space_id = %s",
                               (space.embedding_space_id,))
        await conn.execute("UPDATE embedding_spaces SET state = %s WHERE embedding_space_id = %s",
                           (state, space.embedding_space_id))
        cur = await conn.execute(_CURRENT, (scope_id, objects, objects))
        await upsert_vectors(conn, row, _vector_rows(scope_id, await cur.fetchall(), embedder, vectors or {}))
        target = through if through is not None else await checkpoint(conn, PROJECTION)
        await advance_checkpoint(conn, INDEX_CHECKPOINT, target)
        await notify_checkpoint(conn, INDEX_NOTIFY_CHANNEL, target)
        await conn.commit()
        found = await find_space(conn, space.embedding_space_id)
        assert found is not None
        return found


async def _projected(env: Env) -> bool:
    """The projection has applied the whole ledger (the indexer would follow the same events)."""
    async with await psycopg.AsyncConnection.connect(env.database_url, autocommit=True) as conn:
        cur = await conn.execute("SELECT coalesce(max(ledger_sequence), 0) FROM ledger")
        head = (await cur.fetchone() or (0,))[0]
        return await checkpoint(conn, PROJECTION) >= head


def _vector_rows(scope_id: str, rows: list[Any], embedder: Embedder | None,
                 vectors: dict[str, Sequence[float]]) -> list[VectorRow]:
    out, texts = [], []
    for object_id, version_id, sequence, ledger_sequence, object_type, content in rows:
        given = vectors.get(object_id)
        prepared = prepare(object_type, decode_json(bytes(content))) if content is not None else None
        if given is None and (embedder is None or prepared is None or not prepared.text):
            continue
        out.append(VectorRow(scope_id, object_id, version_id, sequence, ledger_sequence,
                             bool(prepared and prepared.truncated), list(given) if given is not None else []))
        if given is None:
            assert prepared is not None
            texts.append((len(out) - 1, prepared.text))
    if texts:
        assert embedder is not None
        for (i, _), vector in zip(texts, embedder.embed([t for _, t in texts]), strict=True):
            r = out[i]
            out[i] = VectorRow(r.scope_id, r.object_id, r.version_id, r.version_sequence, r.ledger_sequence,
                               r.truncated, vector)
    return out
