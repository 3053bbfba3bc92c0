"""Search end to end with the real indexer follower: write, then search, and see your own write.

Why: the other search tests place vectors with the store functions directly (tests/integration/
search_vectors.py); this one lets the indexer role embed them (its test space, hashing-16), so the SDK's
read-your-writes (`min_sequence` = the last sequence written) is proven against the indexer's checkpoint.
It runs once the indexer role exists (the `roles` parameter of tests.conftest.serving).
"""

from __future__ import annotations

import inspect
from collections.abc import AsyncIterator
from typing import Any

import pytest

from embedding.known import descriptor_for
from pamledger.supervisor import ROLES as ALL_ROLES
from tests.conftest import ACTOR, PROVENANCE, Env, serving, wait_for

pytestmark = [pytest.mark.skipif("roles" not in inspect.signature(serving).parameters or "indexer" not in ALL_ROLES,
                                reason="needs the indexer role ([M4] indexer branch)"),
              pytest.mark.profile("PAMSPEC-Semantic-Query")]
SCOPE = "workspace:search-indexed"


@pytest.fixture(scope="module")
async def indexed(env: Env) -> AsyncIterator[Any]:
    async with serving(env, ALL_ROLES, roles=ALL_ROLES) as client:  # type: ignore[call-arg]
        await client.create_scope(SCOPE)

        async def ready() -> bool:  # the indexer registers its default space at start, then fills it
            found = await client.search(SCOPE, text="anything", mode="semantic", wait_ms=0)
            return bool(found["index"]["state"] == "ready")

        await wait_for(ready, timeout=60)
        yield client


def ids(result: dict[str, Any]) -> list[str]:
    return [item["object_id"] for item in result["items"]]


async def test_a_search_right_after_a_write_finds_it_through_the_indexer(env: Env, indexed: Any) -> None:
    made = await indexed.create(SCOPE, "claim", {"statement": "the kettle boils water"}, ACTOR, PROVENANCE,
                                validation_state="corroborated")
    result = await indexed.search(SCOPE, text="kettle water", mode="semantic", wait_ms=10_000)
    assert result["min_sequence_reached"] is True
    assert result["index"]["checkpoint"] >= made["ledger_sequence"] and result["index"]["state"] == "ready"
    assert result["embedding_space_id"] == descriptor_for(env.settings.indexer.default_space).embedding_space_id
    assert ids(result) == [made["object_id"]] and result["items"][0]["stale"] is False

    updated = await indexed.update(SCOPE, made["object_id"], made["version_id"], {"statement": "the kettle is cold"},
                                   ACTOR, PROVENANCE)
    item = (await indexed.search(SCOPE, text="kettle", mode="semantic", wait_ms=10_000))["items"][0]
    assert (item["version_id"], item["vector_version_id"], item["stale"]) == (updated["version_id"],) * 2 + (False,)

    await indexed.delete(SCOPE, made["object_id"], updated["version_id"], ACTOR, PROVENANCE)
    for mode in ("semantic", "hybrid", "lexical"):
        gone = await indexed.search(SCOPE, text="kettle", mode=mode, wait_ms=10_000,
                                    filter={"availability_states": ["available", "deleted"]})
        assert made["object_id"] not in ids(gone), mode  # no vector, no lexemes: erased content is not found
