"""The Embedding Space descriptor (PAMSPEC embedding-space.schema.json) and the one rule for comparing spaces.

Why: vectors from two spaces are never comparable, and equal dimensions or model names do not make two
spaces one; only the authoritative `embedding_space_id` together with the full descriptor's digest does.
"""

from __future__ import annotations

from typing import Annotated

import msgspec

from schemas.canonical import canonical_bytes, sha256_digest
from schemas.common import Id, Text, Timestamp
from schemas.envelope import Actor

MAX_DIMENSIONS = 2000
FLOAT4_MAX = 3.4028234663852886e38  # the largest float4: a vector's values are stored as float4s
_STRICT: dict[str, bool] = dict(frozen=True, kw_only=True, omit_defaults=True, forbid_unknown_fields=True)


class EmbeddingSpace(msgspec.Struct, **_STRICT):
    """Everything a vector's meaning depends on; `embedding_space_id` is authoritative."""

    embedding_space_id: Id
    provider: Text
    model: Text
    model_revision: Text
    # At most 2,000: the most pgvector's HNSW index takes (and the registry's CHECK). The schema allows more,
    # but a space no vector table here can hold must be refused by the writer, not wedge the indexer later.
    dimensions: Annotated[int, msgspec.Meta(ge=1, le=MAX_DIMENSIONS)]
    distance_metric: Text
    normalization: Text
    preprocessing_profile: Text
    embedding_kind: Text
    canonicalization_rules: Text
    created_at: Timestamp | None = None
    created_by: Actor | None = None


def encode_space(space: EmbeddingSpace) -> bytes:
    """The descriptor as canonical JSON (sorted keys, unset optional fields left out)."""
    return canonical_bytes(space)


def decode_space(data: bytes | str) -> EmbeddingSpace:
    """Decode a descriptor, refusing unknown fields and values outside the schema (msgspec.ValidationError)."""
    return msgspec.json.decode(data, type=EmbeddingSpace)


def space_digest(space: EmbeddingSpace) -> str:
    """The sha256 digest of the canonical descriptor: any changed field gives another digest."""
    return sha256_digest(encode_space(space))


def same_space(a: EmbeddingSpace, b: EmbeddingSpace) -> bool:
    """Whether vectors of `a` and `b` may be compared: same id and same full descriptor, never by dims or names."""
    return a.embedding_space_id == b.embedding_space_id and space_digest(a) == space_digest(b)


class HandedVector(msgspec.Struct, frozen=True, kw_only=True):
    """The vector of one version's content in one space, as an import's bundle carried it: what the writer's
    core decides to hand over (command_handler.core.imports) and what the indexer takes (embedding.handoff)."""

    scope_id: str
    object_id: str
    embedding_space_id: str
    space_digest: str
    version_id: str
    version_sequence: int
    content_digest: str
    vector: tuple[float, ...]
