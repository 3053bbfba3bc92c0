"""Reciprocal rank fusion and the reply's items: pure, so tables of cases."""

from __future__ import annotations

import msgspec
import pytest

from query.hybrid import RRF_K, Fused, candidate_count, items, rrf
from schemas.canonical import canonical_bytes
from schemas.search import decode_search


def test_an_object_both_lists_found_outranks_one_found_by_a_single_list() -> None:
    fused = rrf([[("a", "1"), ("b", "1")], [("b", "1"), ("c", "1")]])
    assert [f.object_id for f in fused] == ["b", "a", "c"]
    assert fused[0] == Fused("b", "1", 1 / (RRF_K + 2) + 1 / (RRF_K + 1), (2, 1))
    assert fused[1].ranks == (1, None) and fused[2].ranks == (None, 2)


def test_equal_fused_scores_order_by_object_id_then_version_id() -> None:
    fused = rrf([[("z", "1"), ("y", "1")], [("y", "1"), ("z", "1")]])
    assert [f.object_id for f in fused] == ["y", "z"]
    assert rrf([[("b", "1")], [("a", "2")]])[0].object_id == "a"


def test_empty_lists_fuse_to_nothing_and_one_list_keeps_its_order() -> None:
    assert rrf([[], []]) == []
    assert [f.object_id for f in rrf([[], [("q", "1"), ("p", "1")]])] == ["q", "p"]


def test_a_repeated_key_in_one_list_counts_once_at_its_best_rank() -> None:
    assert rrf([[("a", "1"), ("a", "1")]]) == [Fused("a", "1", 1 / (RRF_K + 1), (1,))]


def _request(**extra: object) -> object:
    return decode_search(msgspec.json.encode({"scope_id": "workspace:x", "text": "t", **extra}))


@pytest.mark.parametrize("mode, limit, count", [("hybrid", 1, 50), ("hybrid", 20, 100), ("semantic", 7, 7),
                                                ("lexical", 3, 3)])
def test_each_list_contributes_at_least_fifty_candidates_to_a_fusion(mode: str, limit: int, count: int) -> None:
    assert candidate_count(_request(mode=mode, limit=limit)) == count  # type: ignore[arg-type]


META = canonical_bytes({"object_id": "a", "availability_state": "available"})


def test_items_name_every_score_and_flag_a_vector_of_an_older_version_stale() -> None:
    lexical = [(META, b'"x"', 0.5, 9, "a", "v2")]
    semantic = [(META, b'"x"', "a", "v2", 9, "v1", 0.25, True), (META, b'"y"', "b", "v1", 8, "v1", 0.5, False)]
    page = items(_request(), lexical, semantic)  # type: ignore[arg-type]
    assert [i["object_id"] for i in page] == ["a", "b"]
    first = page[0]
    assert (first["lexical_score"], first["semantic_score"], first["lexical_rank"], first["semantic_rank"]) == \
        (0.5, 0.75, 1, 1)
    assert first["stale"] is True and first["vector_version_id"] == "v1"
    assert page[1]["lexical_score"] is None and page[1]["stale"] is False
    only_words = items(_request(mode="lexical"), lexical, [])  # type: ignore[arg-type]
    assert only_words[0]["semantic_score"] is None and only_words[0]["fused_score"] is None
    assert only_words[0]["stale"] is None
