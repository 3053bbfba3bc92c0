"""The SDK's relate / redact / promote / correct_provenance (async and sync) and their CLI commands, against
the real service.

Why: the SDK methods spell out each command's fields by hand; only sending them to the real writer shows the
names and defaults are the wire's, and the CLI shows the same calls from a shell with the one error format.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from pamledger_client.client import MemoryClient, PamspecError, SyncMemoryClient
from tests.conftest import ACTOR, PROVENANCE, Env
from tests.integration.test_cli import error_of, run

SCOPE = "workspace:sdk-objects"
OTHER = "workspace:sdk-objects.other"


@pytest.fixture(scope="module", autouse=True)
async def scopes(client: MemoryClient) -> None:
    await client.create_scope(SCOPE)
    await client.create_scope(OTHER)


async def claim(client: MemoryClient, text: str = "the cache is cold", scope: str = SCOPE) -> dict[str, Any]:
    return await client.create(scope, "claim", {"statement": text, "who": "ana"}, ACTOR,
                               {**PROVENANCE, "source_ref": "urn:src:1"})


async def test_relate_creates_then_updates_a_relationship(client: MemoryClient) -> None:
    a, b = await claim(client), await claim(client, "the cache is warm")
    made = await client.relate(SCOPE, a["object_id"], b["object_id"], "contradicts", ACTOR, PROVENANCE,
                               canonical_content={"weight": 0.5}, validation_state="corroborated")
    envelope = made["envelope"]
    assert made["relationship_id"] == envelope["relationship_id"] and made["sequence"] == 1
    assert (envelope["relationship_type"], envelope["directionality"], envelope["validation_state"]) == (
        "contradicts", "directed", "corroborated")
    again = await client.relate(SCOPE, a["object_id"], b["object_id"], "contradicts", ACTOR, PROVENANCE,
                                directionality="directed", canonical_content={"weight": 0.9},
                                relationship_id=made["relationship_id"], expected_version_id=made["version_id"])
    assert again["sequence"] == 2 and again["envelope"]["canonical_content"] == {"weight": 0.9}
    assert (await client.read(SCOPE, made["relationship_id"]))["version_id"] == again["version_id"]


async def test_relate_across_scopes_needs_a_policy_basis(client: MemoryClient) -> None:
    a, elsewhere = await claim(client), await claim(client, scope=OTHER)
    with pytest.raises(PamspecError) as err:
        await client.relate(SCOPE, a["object_id"], elsewhere["object_id"], "references", ACTOR, PROVENANCE,
                            target_scope_id=OTHER)
    assert err.value.code == "policy_denied"
    made = await client.relate(SCOPE, a["object_id"], elsewhere["object_id"], "references", ACTOR, PROVENANCE,
                               target_scope_id=OTHER, policy_basis="policy:shared-research", directionality="undirected")
    assert made["envelope"]["target_scope_id"] == OTHER and made["envelope"]["directionality"] == "undirected"


async def test_redact_partially_fully_and_by_suppression(client: MemoryClient) -> None:
    partial = await claim(client)
    done = await client.redact(SCOPE, partial["object_id"], partial["version_id"], ACTOR, PROVENANCE, "gdpr:art17",
                               pointers=["/who"])
    assert done["envelope"]["availability_state"] == "partially_redacted"
    assert done["envelope"]["canonical_content"] == {"statement": "the cache is cold", "who": "[REDACTED]"}
    kept = await claim(client)
    suppressed = await client.redact(SCOPE, kept["object_id"], kept["version_id"], ACTOR, PROVENANCE, "review:1",
                                     erase=False)
    restored = await client.transition(SCOPE, kept["object_id"], suppressed["version_id"], "availability", "available",
                                       ACTOR, PROVENANCE, policy_basis="restoration:1")
    assert restored["envelope"]["canonical_content"]["who"] == "ana"
    with pytest.raises(PamspecError) as err:
        await client.redact(SCOPE, kept["object_id"], restored["version_id"], ACTOR, PROVENANCE, "p", pointers=["/nope"])
    assert err.value.code == "invalid_request" and err.value.details["pointer"] == "/nope"


async def test_promote_links_the_new_object_to_its_working_memory(client: MemoryClient) -> None:
    scratch = await client.create(SCOPE, "working_memory", {"task_ref": "task:1", "content": {"n": 1}}, ACTOR,
                                  PROVENANCE)
    promoted = await client.promote(SCOPE, scratch["object_id"], scratch["version_id"], "decision",
                                    {"summary": "ship it"}, ACTOR, PROVENANCE, target_validation_state="corroborated",
                                    quality_signals={"assessed_confidence": 0.8})
    links = promoted["promotion"]
    assert promoted["envelope"]["object_type"] == "decision" and links["promoted_object_id"] == promoted["object_id"]
    assert promoted["envelope"]["quality_signals"] == {"assessed_confidence": 0.8}
    assert (await client.read(SCOPE, scratch["object_id"]))["lifecycle_state"] == "superseded"
    made = await claim(client)
    with pytest.raises(PamspecError) as err:
        await client.promote(SCOPE, made["object_id"], made["version_id"], "decision", {"summary": "x"}, ACTOR,
                             PROVENANCE)
    assert err.value.code == "invalid_request"


async def test_correct_provenance_names_what_it_removes(client: MemoryClient) -> None:
    made = await claim(client)
    corrected = {"provenance_id": "prov:fixed", "actor": ACTOR, "activity": "corrected"}
    with pytest.raises(PamspecError) as err:
        await client.correct_provenance(SCOPE, made["object_id"], made["version_id"], ACTOR, corrected)
    assert err.value.details["dropped_fields"] == ["source_ref"]
    done = await client.correct_provenance(SCOPE, made["object_id"], made["version_id"], ACTOR, corrected,
                                           removed_fields=["source_ref"], policy_basis="audit:7")
    assert done["envelope"]["provenance"]["provenance_id"] == "prov:fixed" and done["sequence"] == 2


async def test_the_sync_client_offers_the_same_methods(service: Env, client: MemoryClient) -> None:
    a, b = await claim(client), await claim(client)

    def work() -> tuple[dict[str, Any], dict[str, Any]]:
        sync = SyncMemoryClient(service.nats_url, service.settings.subject_prefix)
        try:
            related = sync.relate(SCOPE, a["object_id"], b["object_id"], "supports", ACTOR, PROVENANCE)
            redacted = sync.redact(SCOPE, a["object_id"], a["version_id"], ACTOR, PROVENANCE, "p", pointers=["/who"])
            return related, redacted
        finally:
            sync.close()

    related, redacted = await asyncio.to_thread(work)
    assert related["envelope"]["relationship_type"] == "supports"
    assert redacted["envelope"]["availability_state"] == "partially_redacted"


# -- the CLI -------------------------------------------------------------------------------------------

async def test_cli_relate_redact_promote_and_correct_provenance(service: Env, client: MemoryClient,
                                                                tmp_path: Path) -> None:
    a, b = await claim(client), await claim(client)
    code, related, err = await run(service, tmp_path, "relate", SCOPE, a["object_id"], b["object_id"], "supports",
                                   "--content", '{"weight": 1}', "--directionality", "bidirectional")
    assert code == 0, err
    assert related["envelope"]["directionality"] == "bidirectional" and related["envelope"]["canonical_content"] == {
        "weight": 1}
    code, redacted, err = await run(service, tmp_path, "redact", SCOPE, a["object_id"], a["version_id"],
                                    "--policy-basis", "gdpr:art17", "--pointer", "/who", "--pointer", "/statement")
    assert code == 0, err
    assert redacted["envelope"]["canonical_content"] == {"statement": "[REDACTED]", "who": "[REDACTED]"}
    code, suppressed, err = await run(service, tmp_path, "redact", SCOPE, b["object_id"], b["version_id"],
                                      "--policy-basis", "hold", "--suppress")
    assert code == 0, err
    code, restored, err = await run(service, tmp_path, "transition", SCOPE, b["object_id"], suppressed["version_id"],
                                    "availability", "available", "--policy-basis", "restoration:2")
    assert code == 0, err
    assert restored["envelope"]["canonical_content"]["who"] == "ana"
    scratch = await client.create(SCOPE, "working_memory", {"task_ref": "task:2", "content": {}}, ACTOR, PROVENANCE)
    code, promoted, err = await run(service, tmp_path, "promote", SCOPE, scratch["object_id"], scratch["version_id"],
                                    "claim", "-", stdin=b'{"statement": "from stdin"}')
    assert code == 0, err
    assert promoted["envelope"]["canonical_content"] == {"statement": "from stdin"} and "promotion" in promoted
    code, corrected, err = await run(service, tmp_path, "correct-provenance", SCOPE, b["object_id"],
                                     restored["version_id"], '{"provenance_id": "prov:cli:fixed", "activity": "fix"}',
                                     "--remove", "source_ref")
    assert code == 0, err
    assert corrected["envelope"]["provenance"]["provenance_id"] == "prov:cli:fixed"


async def test_cli_failures_are_the_envelope(service: Env, client: MemoryClient, tmp_path: Path) -> None:
    made = await claim(client)
    code, out, err = await run(service, tmp_path, "redact", SCOPE, made["object_id"], made["version_id"],
                               "--policy-basis", "p", "--pointer", "/absent")
    assert (code, out, error_of(err)["code"]) == (1, None, "invalid_request")
    code, out, err = await run(service, tmp_path, "promote", SCOPE, made["object_id"], made["version_id"], "decision",
                               '{"summary": "x"}')
    assert (code, out, error_of(err)["code"]) == (1, None, "invalid_request")
    code, out, err = await run(service, tmp_path, "redact", SCOPE, made["object_id"], made["version_id"])
    assert (code, out, error_of(err)["code"]) == (2, None, "invalid_request")  # --policy-basis is required
    code, out, err = await run(service, tmp_path, "correct-provenance", SCOPE, made["object_id"], made["version_id"],
                               '["not", "an", "object"]')
    assert (code, out, error_of(err)["code"]) == (1, None, "invalid_request")
    code, out, err = await run(service, tmp_path, "relate", SCOPE, made["object_id"], "mem:absent", "supports")
    assert (code, out, error_of(err)["code"]) == (1, None, "object_not_found")
    assert error_of(err)["retryable"] is False
