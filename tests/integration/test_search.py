"""Search over the service: one scope, one space, filters before disclosure, freshness, fusion, bad input.

Vectors come from tests/integration/search_vectors.write_vectors (the indexer's stand-in); objects, the
projection and the envelopes are the real service's.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import msgspec
import psycopg
import pytest

from embedding.embedders import FeatureHashingEmbedder, hashing_space
from pamledger_client.client import MemoryClient, PamspecError, SyncMemoryClient
from tests.conftest import ACTOR, PROVENANCE, Env, run_cli
from tests.integration.search_vectors import write_vectors

pytestmark = pytest.mark.profile("PAMSPEC-Semantic-Query")  # docs/implementation-report.md

SCOPE = "workspace:search"
OTHER = "workspace:search-other"
DIMS = 64
SPACE = hashing_space(DIMS)
EMBED = FeatureHashingEmbedder(DIMS)


def axis(i: int, scale: float = 1.0, second: int | None = None, weight: float = 0.0) -> list[float]:
    vector = [0.0] * DIMS
    vector[i] = scale
    if second is not None:
        vector[second] = weight
    return vector


async def make(client: MemoryClient, text: str, scope: str = SCOPE, **extra: Any) -> dict[str, Any]:
    extra.setdefault("validation_state", "corroborated")
    return await client.create(scope, "claim", {"statement": text}, ACTOR, PROVENANCE, **extra)


def ids(result: dict[str, Any]) -> list[str]:
    return [item["object_id"] for item in result["items"]]


async def state(env: Env) -> tuple[Any, ...]:
    """What a search must never change: the ledger head, the registry and every vector."""
    async with await psycopg.AsyncConnection.connect(env.database_url, autocommit=True) as conn:
        cur = await conn.execute("SELECT (SELECT coalesce(max(ledger_sequence), 0) FROM ledger),"
                                 " (SELECT count(*) FROM embedding_spaces),"
                                 " (SELECT string_agg(descriptor::text || state, ',') FROM embedding_spaces)")
        return tuple(await cur.fetchone() or ())


@pytest.fixture(scope="module")
async def data(client: MemoryClient) -> dict[str, Any]:
    await client.create_scope(SCOPE)
    await client.create_scope(OTHER)
    return {
        "near": await make(client, "the kettle boils water for tea"),
        "far": await make(client, "mountains are tall and cold"),
        "draft": await make(client, "an unverified kettle rumour", validation_state="unverified"),
        "old": await make(client, "an archived kettle note", lifecycle_state="archived"),
        "twin_a": await make(client, "twin one", object_id="obj:twin:a"),
        "twin_b": await make(client, "twin two", object_id="obj:twin:b"),
        "stranger": await make(client, "the kettle boils water for tea", scope=OTHER),
    }


async def vectors(service: Env, data: dict[str, Any]) -> None:
    """Hand-placed vectors: 'near' on axis 0 (slightly off), the twins identical on axis 5."""
    placed = {data["near"]["object_id"]: axis(0, 1.0, 1, 0.1), data["far"]["object_id"]: axis(1),
              data["draft"]["object_id"]: axis(0), data["old"]["object_id"]: axis(0),
              "obj:twin:a": axis(5), "obj:twin:b": axis(5)}
    await write_vectors(service, SPACE, SCOPE, vectors=placed)
    await write_vectors(service, SPACE, OTHER, vectors={data["stranger"]["object_id"]: axis(0)})


async def test_without_any_space_a_search_answers_lexically_and_says_the_index_is_filling(
        service: Env, client: MemoryClient, data: dict[str, Any]) -> None:
    result = await client.search(SCOPE, text="kettle")
    assert result["index"]["state"] == "filling" and result["embedding_space_id"] is None
    assert ids(result) == [data["near"]["object_id"]]
    assert result["items"][0]["semantic_score"] is None and result["items"][0]["lexical_score"] > 0


async def test_without_any_space_a_vector_search_is_embedding_space_mismatch(
        service: Env, client: MemoryClient, data: dict[str, Any]) -> None:
    """A vector belongs to some space; with none registered it belongs to none (PAMSPEC's
    vector-without-embedding-space), where an empty answer would pass for "nothing is near"."""
    for mode in ("semantic", "hybrid"):
        with pytest.raises(PamspecError) as caught:
            await client.search(SCOPE, vector=axis(0), mode=mode)
        assert caught.value.code == "embedding_space_mismatch" and caught.value.details["embedding_space_id"] is None


async def test_a_nearer_vector_in_another_scope_is_never_returned(service: Env, client: MemoryClient,
                                                                  data: dict[str, Any]) -> None:
    await vectors(service, data)
    result = await client.search(SCOPE, vector=axis(0), mode="semantic", limit=100)
    assert data["stranger"]["object_id"] not in ids(result)
    assert ids(result)[0] == data["near"]["object_id"]
    top = result["items"][0]
    assert top["semantic_score"] == pytest.approx(1 / (1.01 ** 0.5), abs=1e-6)
    assert top["envelope"]["canonical_content"] == {"statement": "the kettle boils water for tea"}
    assert result["embedding_space_id"] == SPACE.embedding_space_id
    assert result["index"] == {"index_id": result["index"]["index_id"], "state": "ready",
                               "checkpoint": result["index"]["checkpoint"], "method": "exact",
                               "approximate": False, "ef_search": None}
    assert result["index"]["index_id"].startswith("pamledger:vectors:")
    assert result["index"]["checkpoint"] >= data["stranger"]["ledger_sequence"]


async def test_archived_and_unverified_objects_never_show_by_default(client: MemoryClient,
                                                                     data: dict[str, Any]) -> None:
    result = await client.search(SCOPE, vector=axis(0), mode="semantic", limit=100)
    assert data["draft"]["object_id"] not in ids(result) and data["old"]["object_id"] not in ids(result)
    assert result["filters"]["validation_states"] == ["corroborated"]
    wider = await client.search(SCOPE, vector=axis(0), mode="semantic", limit=2,
                                filter={"validation_states": ["unverified"]})
    assert ids(wider) == [data["draft"]["object_id"]]  # the filter ran before the limit, not after


async def test_equal_scores_order_by_object_id_then_version_every_time(client: MemoryClient,
                                                                       data: dict[str, Any]) -> None:
    runs = [await client.search(SCOPE, vector=axis(5), mode="semantic", limit=2) for _ in range(3)]
    assert all(ids(r) == ["obj:twin:a", "obj:twin:b"] for r in runs)
    assert runs[0]["tie_break"] == ["semantic_score desc", "object_id asc", "version_id asc"]


async def test_a_vector_of_an_older_version_is_flagged_stale_until_replaced(
        service: Env, client: MemoryClient, data: dict[str, Any]) -> None:
    far = data["far"]
    updated = await client.update(SCOPE, far["object_id"], far["version_id"], {"statement": "hills"}, ACTOR,
                                  PROVENANCE)
    result = await client.search(SCOPE, vector=axis(1), mode="semantic", limit=1)
    item = result["items"][0]
    assert (item["object_id"], item["version_id"]) == (far["object_id"], updated["version_id"])
    assert item["stale"] is True and item["vector_version_id"] == far["version_id"]
    await write_vectors(service, SPACE, SCOPE, vectors={far["object_id"]: axis(1)}, objects=[far["object_id"]])
    item = (await client.search(SCOPE, vector=axis(1), mode="semantic", limit=1))["items"][0]
    assert item["stale"] is False and item["vector_version_id"] == updated["version_id"]


async def test_a_space_still_filling_answers_and_says_results_may_miss_older_objects(
        service: Env, client: MemoryClient, data: dict[str, Any]) -> None:
    await write_vectors(service, SPACE, SCOPE, objects=[], state="filling")
    try:
        result = await client.search(SCOPE, vector=axis(0), mode="semantic", limit=1)
        assert result["index"]["state"] == "filling" and ids(result) == [data["near"]["object_id"]]
    finally:
        await write_vectors(service, SPACE, SCOPE, objects=[], state="ready")


async def test_hybrid_fuses_both_lists_and_shows_both_scores(service: Env, client: MemoryClient,
                                                             data: dict[str, Any]) -> None:
    scope = "workspace:search-hybrid"
    await client.create_scope(scope)
    boil = await make(client, "the kettle boils water", scope=scope)
    steep = await make(client, "tea steeps in water", scope=scope)
    await make(client, "mountains are tall", scope=scope)
    await write_vectors(service, SPACE, scope, embedder=EMBED)
    # Words: only 'boil' holds both "kettle" and "water"; meaning (hashing): 'steep' shares "water" too.
    result = await client.search(scope, text="kettle water", space=SPACE.embedding_space_id, limit=10)
    by_id = {item["object_id"]: item for item in result["items"]}
    top = by_id[boil["object_id"]]
    assert ids(result)[0] == boil["object_id"]
    assert (top["lexical_rank"], top["semantic_rank"]) == (1, 1) and top["lexical_score"] > 0
    assert top["fused_score"] == pytest.approx(2 / 61)
    second = by_id[steep["object_id"]]
    assert second["lexical_score"] is None and second["lexical_rank"] is None
    assert second["semantic_score"] > 0 and second["fused_score"] == pytest.approx(1 / 62)
    fused = [item["fused_score"] for item in result["items"]]
    assert fused == sorted(fused, reverse=True)
    assert result["tie_break"] == ["fused_score desc", "object_id asc", "version_id asc"]
    lexical = await client.search(SCOPE, text="kettle", mode="lexical")
    assert ids(lexical) == [data["near"]["object_id"]] and lexical["index"] is None
    assert set(lexical["items"][0]) == set(top)
    assert lexical["items"][0]["semantic_score"] is None and lexical["items"][0]["fused_score"] is None


async def test_min_sequence_waits_for_the_index_checkpoint(service: Env, client: MemoryClient,
                                                           data: dict[str, Any]) -> None:
    fresh = await make(client, "a brand new teapot")
    late = await client.search(SCOPE, vector=axis(9), mode="semantic", min_sequence=fresh["ledger_sequence"],
                               wait_ms=100)
    assert late["min_sequence_reached"] is False and fresh["object_id"] not in ids(late)
    waiting = asyncio.create_task(client.search(SCOPE, vector=axis(9), mode="semantic", wait_ms=10_000,
                                                min_sequence=fresh["ledger_sequence"]))
    await asyncio.sleep(0.3)  # let the search start waiting; the assertion below holds either way
    await write_vectors(service, SPACE, SCOPE, vectors={fresh["object_id"]: axis(9)}, objects=[fresh["object_id"]],
                        through=fresh["ledger_sequence"])
    result = await waiting
    assert result["min_sequence_reached"] is True and ids(result)[0] == fresh["object_id"]


BAD = [
    ({}, "invalid_request"),  # neither text nor vector
    ({"text": "kettle", "vector": axis(0)}, "invalid_request"),
    ({"vector": axis(0), "mode": "lexical"}, "invalid_request"),
    ({"text": "   \n\t"}, "invalid_request"),
    ({"text": ""}, "invalid_request"),
    ({"text": "x" * 4097}, "invalid_request"),
    ({"text": "kettle", "limit": 101}, "invalid_request"),
    ({"text": "kettle", "limit": 0}, "invalid_request"),
    ({"text": "kettle", "mode": "fuzzy"}, "invalid_request"),
    ({"text": "kettle", "colour": "red"}, "invalid_request"),
    ({"text": "kettle", "validation_states": []}, "invalid_request"),
    ({"text": "kettle\u0000"}, "invalid_request"),
    ({"vector": [0.0] * DIMS}, "invalid_request"),  # no direction
    ({"vector": axis(0)[:10]}, "embedding_space_mismatch"),
    ({"vector": axis(0) + [0.0]}, "embedding_space_mismatch"),
    ({"text": "kettle", "embedding_space_id": "space:nobody:v1"}, "invalid_request"),
    ({"text": "kettle", "embedding_space_id": "space:acme:v1"}, "embedding_space_mismatch"),
    ({"text": "kettle", "time": {"observed_at": {"gte": "2026-02-01T00:00:00Z", "lt": "2026-01-01T00:00:00Z"}}},
     "invalid_request"),
]


async def register_foreign_space(service: Env) -> None:
    """A space of a model this build has no embedder for (registered directly: a search still names it)."""
    foreign = msgspec.structs.replace(SPACE, embedding_space_id="space:acme:v1", provider="acme", model="acme-embed")
    await write_vectors(service, foreign, SCOPE, default=False)


@pytest.mark.parametrize("body, code", BAD)
async def test_bad_searches_are_refused_and_change_nothing(service: Env, client: MemoryClient, data: dict[str, Any],
                                                           body: dict[str, Any], code: str) -> None:
    await register_foreign_space(service)
    before = await state(service)
    raw = msgspec.json.encode({"scope_id": SCOPE, **body})
    reply = json.loads((await client.nc.request(f"{service.settings.subject_prefix}.query.search", raw, timeout=20)).data)
    assert reply["error"]["code"] == code, reply
    if body.get("embedding_space_id") == "space:nobody:v1":
        assert reply["error"]["details"] == {"embedding_space_id": "space:nobody:v1"}
    assert await state(service) == before


@pytest.mark.parametrize("raw", [b'{"scope_id": "workspace:search", "vector": [1e999]}',
                                 b'{"scope_id": "workspace:search", "vector": [NaN]}',
                                 b'{"scope_id": "workspace:search", "vector": [Infinity]}', b"not json"])
async def test_non_finite_vectors_and_broken_json_are_invalid_requests(service: Env, client: MemoryClient,
                                                                        raw: bytes) -> None:
    reply = json.loads((await client.nc.request(f"{service.settings.subject_prefix}.query.search", raw, timeout=20)).data)
    assert reply["error"]["code"] == "invalid_request"


async def test_an_unknown_scope_is_scope_not_found(client: MemoryClient, data: dict[str, Any]) -> None:
    with pytest.raises(PamspecError) as refused:
        await client.search("workspace:nowhere", text="kettle")
    assert refused.value.code == "scope_not_found"


async def test_the_cli_prints_the_reply_and_errors_as_the_envelope(service: Env, data: dict[str, Any]) -> None:
    done = await asyncio.to_thread(run_cli, service, "search", SCOPE, "kettle", "--mode", "lexical", "--limit", "3")
    assert done.returncode == 0, done.stderr
    assert [i["object_id"] for i in json.loads(done.stdout)["items"]] == [data["near"]["object_id"]]
    bad = await asyncio.to_thread(run_cli, service, "search", SCOPE, "kettle", "--space", "space:nobody:v1")
    assert bad.returncode != 0
    assert json.loads(bad.stderr.strip().splitlines()[-1])["error"]["code"] == "invalid_request"


async def test_the_sync_client_searches_with_a_filter(service: Env, data: dict[str, Any]) -> None:
    def run() -> list[str]:
        sync = SyncMemoryClient(service.nats_url, service.settings.subject_prefix)
        try:
            found = sync.search(SCOPE, vector=axis(0), mode="semantic", limit=5,
                                filter={"validation_states": ["unverified"], "object_types": ["claim"]})
            return ids(found)
        finally:
            sync.close()

    assert await asyncio.to_thread(run) == [data["draft"]["object_id"]]


async def test_zero_vectors_rank_nothing_and_break_nothing(service: Env, client: MemoryClient,
                                                           data: dict[str, Any]) -> None:
    blank = await make(client, "blank")
    await write_vectors(service, SPACE, SCOPE, vectors={blank["object_id"]: [0.0] * DIMS}, objects=[blank["object_id"]])
    found = await client.search(SCOPE, vector=axis(0), mode="semantic", limit=100)
    assert blank["object_id"] not in ids(found) and data["near"]["object_id"] in ids(found)
    assert all(isinstance(i["semantic_score"], float) for i in found["items"])
    nothing = await client.search(SCOPE, text="!!! ???", mode="semantic")  # hashes to the zero vector
    assert nothing["items"] == [] and nothing["index"]["method"] is None


async def test_filters_that_reject_the_nearest_hundred_still_find_the_rest_of_the_scope(
        service: Env, client: MemoryClient) -> None:
    """Exact search ranks a shortlist (max(4·k, 100)) before it reads the projection; when the filters leave
    fewer than k of it, every vector of the scope is ranked instead: the five far-away drafts are found
    behind 110 nearer archived claims."""
    scope = "workspace:search-shortlist"
    await client.create_scope(scope)
    near = [await make(client, f"archived {i}", scope=scope, lifecycle_state="archived") for i in range(110)]
    far = [await make(client, f"active {i}", scope=scope) for i in range(5)]
    placed = {n["object_id"]: axis(0, 1.0, 2, 0.01 * i) for i, n in enumerate(near)}
    placed.update({f["object_id"]: axis(1, 1.0, 0, 0.1 + 0.01 * i) for i, f in enumerate(far)})
    await write_vectors(service, SPACE, scope, vectors=placed)
    result = await client.search(scope, vector=axis(0), mode="semantic", limit=5)
    assert ids(result) == [f["object_id"] for f in reversed(far)]  # the most axis-0 weight first
    assert result["index"]["method"] == "exact"
