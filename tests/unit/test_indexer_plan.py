"""indexer.plan: which versions a batch asks vectors for, which objects it erases, which registry rows it makes.

Why a table: the fold decides what the follower writes; its rules (last version wins, an erasure wins over
earlier versions, the indexer's own entries are ignored) are cheaper to pin here than through servers.
"""

from __future__ import annotations

from typing import Any

import msgspec

from embedding.embedders import hashing_space
from embedding.store import SpaceRow, VectorRow
from indexer.plan import DefaultSwitch, Registration, plan_batch
from indexer.step import generated_entries
from schemas.common import SYSTEM_SCOPE


def event(event_type: str, object_id: str | None = "mem:a", version: str = "ver:1", sequence: int = 1,
          availability: str = "available", digest: str | None = "sha256:x", scope: str = "workspace:w",
          **payload: Any) -> bytes:
    body: dict[str, Any] = {"event_type": event_type, "scope_id": scope, "object_id": object_id,
                            "unknown_field": 1, "payload": dict(payload)}
    if object_id is not None:
        body["payload"].update(envelope={"version_id": version, "sequence": sequence, "object_type": "claim",
                                         "availability_state": availability, "more": "ignored"},
                               content_digest=digest)
    return msgspec.json.encode(body)


def test_the_last_version_of_an_object_in_a_batch_is_the_one_embedded() -> None:
    plan = plan_batch([(5, event("object_created")),
                       (6, event("object_updated", version="ver:2", sequence=2, digest="sha256:y")),
                       (7, event("object_created", object_id="mem:b", version="ver:b"))])
    assert {k: (v.version_id, v.ledger_sequence, v.content_digest) for k, v in plan.versions.items()} == {
        ("workspace:w", "mem:a"): ("ver:2", 6, "sha256:y"), ("workspace:w", "mem:b"): ("ver:b", 7, "sha256:x")}
    assert (plan.from_sequence, plan.through_sequence, plan.erased) == (5, 7, set())


def test_delete_and_redaction_erase_the_object_and_drop_its_earlier_versions() -> None:
    plan = plan_batch([(1, event("object_created")),
                       (2, event("object_deleted", version="ver:2", sequence=2, availability="deleted", digest=None)),
                       (3, event("object_created", object_id="mem:b")),
                       (4, event("availability_transitioned", object_id="mem:b", version="ver:3", sequence=2,
                                 availability="redacted", digest=None)),
                       (5, event("object_redacted", object_id="mem:c", availability="redacted", digest=None))])
    assert plan.versions == {}
    assert plan.erased == {("workspace:w", "mem:a"), ("workspace:w", "mem:b"), ("workspace:w", "mem:c")}


def test_the_indexers_own_entries_and_events_without_a_version_are_ignored() -> None:
    plan = plan_batch([(1, event("embedding_generated", object_id=None, items=[["mem:a", "ver:1"]])),
                       (2, event("index_rebuilt", object_id=None, action="rebuild_completed")),
                       (3, event("index_rebuilt", object_id=None, scope=SYSTEM_SCOPE, action="rebuild_completed")),
                       (4, event("subscription_opened", object_id=None))])
    assert (plan.versions, plan.erased, plan.registry) == ({}, set(), [])


def test_system_entries_register_spaces_and_switch_the_default_in_order() -> None:
    space = msgspec.to_builtins(hashing_space(8))
    plan = plan_batch([(1, event("index_rebuilt", object_id=None, scope=SYSTEM_SCOPE, action="space_registered",
                                 embedding_space=space, space_digest="sha256:d")),
                       (2, event("index_rebuilt", object_id=None, scope=SYSTEM_SCOPE, action="default_space_set",
                                 embedding_space_id=space["embedding_space_id"])),
                       # the same actions outside the system scope are nobody's registry
                       (3, event("index_rebuilt", object_id=None, action="default_space_set",
                                 embedding_space_id="space:other:v1"))])
    assert plan.registry == [Registration(1, space, "sha256:d"), DefaultSwitch(2, space["embedding_space_id"])]


def test_one_generated_entry_per_scope_with_a_deterministic_key() -> None:
    space = SpaceRow("space:s:v1", 3, hashing_space(8), "sha256:d", 8, 1, "ready", 1, True, 1)
    rows = [VectorRow(scope, obj, f"ver:{obj}", 1, 9, False, [0.0] * 8) for scope, obj in
            (("workspace:b", "mem:1"), ("workspace:a", "mem:2"), ("workspace:b", "mem:3"))]
    entries = generated_entries(space, rows, 7, 9)
    assert [(e.scope_id, e.idempotency_key, e.payload["count"], e.payload["items"]) for e in entries] == [
        ("workspace:a", "emb:3:9:workspace:a", 1, [["mem:2", "ver:mem:2"]]),
        ("workspace:b", "emb:3:9:workspace:b", 2, [["mem:1", "ver:mem:1"], ["mem:3", "ver:mem:3"]])]
    long_scope = "workspace:" + "x" * 400
    [entry] = generated_entries(space, [VectorRow(long_scope, "mem:1", "ver:1", 1, 9, False, [0.0] * 8)], 7, 9)
    assert len(entry.idempotency_key) <= 256 and entry.idempotency_key.startswith("emb:sha256:")


def test_vectors_an_import_handed_over_are_named_reused_not_embedded() -> None:
    space = SpaceRow("space:s:v1", 3, hashing_space(8), "sha256:d", 8, 1, "ready", 1, True, 1)
    embedded = [VectorRow("workspace:a", "mem:1", "ver:1", 1, 9, False, [0.0] * 8)]
    reused = [VectorRow(scope, obj, f"ver:{obj}", 2, 9, False, [0.0] * 8) for scope, obj in
              (("workspace:a", "mem:2"), ("workspace:b", "mem:3"))]
    entries = generated_entries(space, embedded, 7, 9, reused)
    assert [(e.scope_id, e.payload["count"], e.payload["items"], e.payload.get("reused")) for e in entries] == [
        ("workspace:a", 1, [["mem:1", "ver:1"]], [["mem:2", "ver:mem:2"]]),
        ("workspace:b", 0, [], [["mem:3", "ver:mem:3"]])]
    assert "reused" not in generated_entries(space, embedded, 7, 9)[0].payload


def test_the_system_scopes_objects_are_never_embedded() -> None:
    """Actors and credentials (with their token digests) live in the system scope: they are not memory."""
    plan = plan_batch([(1, event("object_created", object_id="actor:agent:a", scope=SYSTEM_SCOPE)),
                       (2, event("object_created"))])
    assert set(plan.versions) == {("workspace:w", "mem:a")}
