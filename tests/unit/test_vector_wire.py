"""pgvector's binary form as the indexer sends it: header, big-endian float4s, refusals."""

import math
import struct

import numpy as np
import pytest

from embedding.vector_wire import MAX_DIMENSIONS, vector_bytes, vector_from_bytes


def test_header_and_values_are_pgvectors_binary_form():
    data = vector_bytes([1.0, -0.5, 0.25])
    assert data[:4] == struct.pack("!HH", 3, 0)
    assert struct.unpack("!3f", data[4:]) == (1.0, -0.5, 0.25)


def test_round_trip_rounds_to_float4_once():
    values = [math.pi, -1e-7, 0.1, 2.0 ** -126]
    back = vector_from_bytes(vector_bytes(values))
    assert back == np.asarray(values, dtype=np.float32).astype(float).tolist()


@pytest.mark.parametrize("bad", [[float("nan"), 1.0], [float("inf")], [1e39], [], [[1.0, 2.0]]])
def test_refuses_what_no_similarity_can_use(bad):
    with pytest.raises(ValueError):
        vector_bytes(bad)


def test_refuses_more_dimensions_than_pgvector_holds():
    with pytest.raises(ValueError, match="dimensions"):
        vector_bytes([0.0] * (MAX_DIMENSIONS + 1))
