"""Content → text → vectors: the part the live follower and the fill share.

Why apart: both must produce exactly the same vector for the same version (the space's preprocessing
profile, then its embedder), and both must declare truncation the same way: the profile's cut OR the
model window's (`overflows`, when the embedder has a window).
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import msgspec
import psycopg

from embedding.embedders import Embedder
from embedding.text_profile import Prepared, prepare

_CONTENTS = ("SELECT v.version_id, c.content FROM memory_versions v"
             " JOIN content_store c ON c.content_digest = v.content_digest WHERE v.version_id = ANY(%s)")


@dataclass(frozen=True)
class Embedded:
    vector: list[float]
    truncated: bool


async def read_contents(conn: psycopg.AsyncConnection[Any], version_ids: Sequence[str]) -> dict[str, bytes]:
    """The stored content (canonical JSON) of these versions; a version whose content is gone (erased since)
    is left out: its erasure is on its way to the follower, and writing a vector for it would undo that."""
    if not version_ids:
        return {}
    cur = await conn.execute(_CONTENTS, (list(version_ids),))
    return {row[0]: bytes(row[1]) for row in await cur.fetchall()}


def text_of(object_type: str, content: bytes) -> Prepared:
    """The profile's text of one stored content; content that is not JSON contributes nothing (the writer
    only stores JSON, so this is defence, not a path)."""
    try:
        value = msgspec.json.decode(content)
    except msgspec.DecodeError:
        return Prepared("", truncated=False)
    return prepare(object_type, value)


async def embed(embedder: Embedder, prepared: Sequence[Prepared], batch: int) -> list[Embedded]:
    """Vectors for non-empty texts, embedded in a thread (the event loop keeps acking and answering status),
    `batch` texts per call."""
    texts = [p.text for p in prepared]
    out: list[Embedded] = []
    for start in range(0, len(texts), batch):
        chunk = texts[start:start + batch]
        vectors, cut = await asyncio.to_thread(_embed_chunk, embedder, chunk)
        for i, vector in enumerate(vectors):
            out.append(Embedded(vector, prepared[start + i].truncated or cut[i]))
    return out


def _embed_chunk(embedder: Embedder, texts: list[str]) -> tuple[list[list[float]], list[bool]]:
    overflows = getattr(embedder, "overflows", None)
    cut = list(overflows(texts)) if overflows is not None else [False] * len(texts)
    return embedder.embed(texts), cut
