"""The feature-hashing embedder and the embedders' shared contract, without a model.

Why: tests and baselines lean on feature hashing being the same vector for the same text on every machine
and run (a stable hash, not Python's salted hash()), unit length, and inside its own named space.
"""

from __future__ import annotations

import math

import pytest

from embedding.embedders import Embedder, FeatureHashingEmbedder, hashing_space, token_bucket
from schemas.canonical import decode_json
from schemas.embedding import encode_space, same_space
from tests.integration.test_pamspec_conformance import schema_errors


def norm(vector: list[float]) -> float:
    return math.sqrt(sum(x * x for x in vector))


def test_token_hash_is_stable_across_runs() -> None:
    # Golden values: a change here changes every stored hashing vector (bump the space's revision).
    assert token_bucket("memory", 384) == (360, -1.0)
    assert token_bucket("ledger", 384) == (195, -1.0)


def test_golden_vector() -> None:
    got = FeatureHashingEmbedder(8).embed(["memory ledger memory"])[0]
    assert got == pytest.approx([-2 / math.sqrt(5), 0, 0, -1 / math.sqrt(5), 0, 0, 0, 0])


def test_same_text_same_vector_and_unit_norm() -> None:
    embedder = FeatureHashingEmbedder(256)
    first, again, other = embedder.embed(["Persistent memory", "Persistent memory", "a different text"])
    assert first == again != other
    assert all(norm(v) == pytest.approx(1.0) for v in (first, other))
    assert all(len(v) == 256 for v in (first, other))


def test_case_and_unicode_form_do_not_matter() -> None:
    embedder = FeatureHashingEmbedder(64)
    nfd, nfc = embedder.embed(["CAFE\u0301 menu", "café menu"])
    assert nfd == nfc


@pytest.mark.parametrize("bad", ["", "   ", "\n\t"])
def test_empty_text_is_refused(bad: str) -> None:
    with pytest.raises(ValueError, match="empty or whitespace"):
        FeatureHashingEmbedder(8).embed(["fine", bad])


def test_zero_dimensions_refused() -> None:
    with pytest.raises(ValueError):
        FeatureHashingEmbedder(0)


def test_descriptor_is_an_official_embedding_space_per_dimension() -> None:
    embedder: Embedder = FeatureHashingEmbedder(128)
    assert schema_errors("embedding-space.schema.json", decode_json(encode_space(embedder.descriptor))) == []
    assert embedder.descriptor.dimensions == 128
    assert same_space(embedder.descriptor, hashing_space(128))
    assert not same_space(hashing_space(128), hashing_space(256))


def test_an_embedder_is_handed_out_only_for_its_exact_space() -> None:
    import msgspec

    from embedding.known import descriptor_for, embedder_for

    space = descriptor_for("hashing-16")
    embedder = embedder_for(space)
    assert embedder is not None and embedder.descriptor == space
    assert embedder_for(space) is embedder  # loaded once
    # Same id and dimensions, another descriptor: not the same space, no embedder.
    assert embedder_for(msgspec.structs.replace(space, model_revision="other")) is None
    assert embedder_for(msgspec.structs.replace(space, embedding_space_id="space:other:1")) is None
    for bad in ("hashing-0", "hashing-2001", "hashing-x", "bert", "hashing-16\n"):
        with pytest.raises(ValueError):
            descriptor_for(bad)
