"""Search through an evaluation scope: the run's own objects and the snapshot's it has not written, in all three
modes; an object the run rewrote is found by its new words only (copy on write), the base's version of it
never. Real servers, the indexer running (semantic search ranks kept vectors of the snapshot's versions)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest

from pamledger_client.client import MemoryClient
from pamledger.supervisor import ROLES as ALL_ROLES
from tests.conftest import ACTOR, PROVENANCE, Env, serving, wait_for
from tests.integration.test_indexer import indexed_through

pytestmark = pytest.mark.profile("PAMSPEC-Evaluation")

SCOPE = "workspace:eval-search"
EVAL = "eval:run:search"
WIDE: dict[str, Any] = {"validation_states": ["unverified", "corroborated"]}


@pytest.fixture(scope="module")
async def world(env: Env) -> AsyncIterator[tuple[MemoryClient, dict[str, Any]]]:
    async with serving(env, ALL_ROLES, roles=ALL_ROLES) as client:
        await client.create_scope(SCOPE)
        made = {name: await client.create(SCOPE, "claim", {"statement": text}, ACTOR, PROVENANCE)
                for name, text in (("kept", "zebras graze on the savanna"), ("rewritten", "penguins huddle on the ice"))}
        sealed = await client.snapshot_create(SCOPE, ACTOR, snapshot_id="snap:eval-search",
                                              evaluation_run_id="run:search")
        made["late"] = await client.create(SCOPE, "claim", {"statement": "zebras after the seal"}, ACTOR, PROVENANCE)
        await client.eval_start(SCOPE, sealed["snapshot"]["snapshot_id"], ACTOR, evaluation_scope_id=EVAL)
        made["changed"] = await client.update(EVAL, made["rewritten"]["object_id"], made["rewritten"]["version_id"],
                                              {"statement": "volcanoes erupt at night"}, ACTOR, PROVENANCE)
        made["own"] = await client.create(EVAL, "claim", {"statement": "zebras in the evaluation"}, ACTOR, PROVENANCE)
        await wait_for(lambda: indexed_through(env, made["own"]["ledger_sequence"]), timeout=60)
        yield client, made


async def _found(client: MemoryClient, text: str, mode: str) -> dict[str, str]:
    """object id -> version id of the hits, waiting out the projection and the index."""
    reply = await client.search(EVAL, text=text, mode=mode, filter=WIDE, limit=10)
    return {item["object_id"]: item["version_id"] for item in reply["items"]}


@pytest.mark.parametrize("mode", ["lexical", "semantic", "hybrid"])
async def test_the_evaluation_scope_searches_its_own_and_the_snapshots_objects(
        world: tuple[MemoryClient, dict[str, Any]], mode: str) -> None:
    client, made = world
    zebras = await _found(client, "zebras", mode)
    assert made["kept"]["object_id"] in zebras and made["own"]["object_id"] in zebras  # the snapshot's and its own
    assert zebras[made["kept"]["object_id"]] == made["kept"]["version_id"]
    assert made["late"]["object_id"] not in zebras  # written to the base after the seal: not in the run's world
    penguins = await _found(client, "penguins huddle", mode)
    # Rewritten by the run: its new words only, never the snapshot's version of it.
    assert penguins.get(made["rewritten"]["object_id"]) in (None, made["changed"]["version_id"])
    if mode == "lexical":
        assert made["rewritten"]["object_id"] not in penguins
    volcanoes = await _found(client, "volcanoes erupt", mode)
    assert volcanoes[made["rewritten"]["object_id"]] == made["changed"]["version_id"]
