"""The real offline model (all-MiniLM-L6-v2 int8 ONNX): shape, unit norm, determinism, and that it means something.

Why: the default space's vectors come from here; a wrong tokenizer, pooling or normalisation still gives
384 floats, so only related-versus-unrelated similarity shows the pipeline is right. Loads once per module.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pytest

from embedding.embedders import MINILM_WINDOW, Embedder, MiniLMEmbedder, minilm_space
from schemas.canonical import decode_json
from schemas.embedding import encode_space, same_space
from tests.integration.test_pamspec_conformance import schema_errors

pytestmark = pytest.mark.model


@pytest.fixture(scope="module")
def model() -> MiniLMEmbedder:
    return MiniLMEmbedder(batch_size=4)


def cosines(model: Embedder, texts: Sequence[str]) -> np.ndarray:
    vectors = np.array(model.embed(texts))
    return vectors @ vectors.T


def test_384_dims_unit_norm(model: MiniLMEmbedder) -> None:
    vectors = np.array(model.embed(["Persistent memory is distinct from temporary context.", "ok"]))
    assert vectors.shape == (2, 384)
    assert np.allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-5)
    assert np.isfinite(vectors).all()


def test_related_sentences_score_higher_than_unrelated(model: MiniLMEmbedder) -> None:
    sims = cosines(model, [
        "The cat sits on the mat.",
        "A kitten is resting on a rug.",
        "Quarterly revenue grew by ten percent.",
        "The database stores every event in an append-only ledger.",
        "All changes are appended to an immutable log in Postgres.",
    ])
    assert sims[0, 1] > sims[0, 2] + 0.3
    assert sims[3, 4] > max(sims[3, 0], sims[3, 2]) + 0.2


def test_same_text_same_vector_whatever_the_batch(model: MiniLMEmbedder) -> None:
    alone = model.embed(["memory that outlives the session"])[0]
    batch = model.embed(["short", "memory that outlives the session", "a much longer neighbour " * 20, "x y"])
    assert np.allclose(alone, batch[1], atol=1e-5)
    assert model.embed(["memory that outlives the session"])[0] == alone


def test_window_truncates_and_reports_it(model: MiniLMEmbedder) -> None:
    long = "word " * (MINILM_WINDOW * 2)
    assert model.overflows(["short text", long]) == [False, True]
    assert np.allclose(model.embed([long])[0], model.embed([long + "tail tail tail"])[0], atol=1e-6)


def test_empty_text_is_refused(model: MiniLMEmbedder) -> None:
    with pytest.raises(ValueError, match="empty or whitespace"):
        model.embed([" "])


def test_descriptor_is_pinned_and_official(model: MiniLMEmbedder) -> None:
    space = model.descriptor
    assert schema_errors("embedding-space.schema.json", decode_json(encode_space(space))) == []
    assert space.dimensions == 384 and same_space(space, minilm_space())
    assert "sha256:" in space.model_revision
