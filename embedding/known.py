"""Which embedders this build can run, and the one way to get one for a registered space.

Why: the indexer (documents) and search (query text) must embed with exactly the space's descriptor; an
embedder is handed out only when its own descriptor is the same space (`same_space`: id and full digest),
never because a name or the dimensions match. Models load once per process, on first use.
"""

from __future__ import annotations

import re
import threading

from embedding.embedders import Embedder, FeatureHashingEmbedder, MiniLMEmbedder, hashing_space, minilm_space
from schemas.embedding import EmbeddingSpace, same_space

_HASHING = re.compile(r"hashing-([1-9][0-9]{0,3})\Z")
_loaded: dict[str, Embedder] = {}
_lock = threading.Lock()
MINILM = "minilm"


def descriptor_for(model: str) -> EmbeddingSpace:
    """The space a model name stands for: "minilm" (the default) or "hashing-N" (N dimensions, 1..2000).
    Raises ValueError for anything else."""
    if model == MINILM:
        return minilm_space()
    match = _HASHING.fullmatch(model)
    if match and int(match.group(1)) <= 2000:
        return hashing_space(int(match.group(1)))
    raise ValueError(f"unknown embedding model {model!r}: use 'minilm' or 'hashing-N' (N dimensions, 1..2000)")


def embedder_for(space: EmbeddingSpace, threads: int | None = None) -> Embedder | None:
    """An embedder that produces exactly this space's vectors, or None when this build has none for it
    (another provider, or the same id with another descriptor). Thread-safe; one instance per space."""
    with _lock:
        found = _loaded.get(space.embedding_space_id)
        if found is None:
            found = _make(space, threads)
            if found is None:
                return None
            _loaded[space.embedding_space_id] = found
    return found if same_space(found.descriptor, space) else None


def loaded_embedder(space: EmbeddingSpace) -> Embedder | None:
    """The embedder `embedder_for` already made for this space, or None (then ask `embedder_for`, in a thread:
    loading a model takes seconds). Lets the indexer skip a thread hand-off per batch and space."""
    with _lock:
        found = _loaded.get(space.embedding_space_id)
    return found if found is not None and same_space(found.descriptor, space) else None


def _make(space: EmbeddingSpace, threads: int | None) -> Embedder | None:
    if same_space(space, minilm_space()):
        return MiniLMEmbedder(threads=threads)
    if space.dimensions <= 2000 and same_space(space, hashing_space(space.dimensions)):
        return FeatureHashingEmbedder(space.dimensions)
    return None
