"""indexer.plan after a partial redaction: the object's old vectors go and the projection is embedded.

Why: the vectors of the versions before a partial redaction were made from content that held the removed
values; keeping them would keep the erased text findable by similarity. The projection (what the redaction
permits) is the object's current content and must stay searchable.
"""

from __future__ import annotations

import msgspec

from indexer.plan import plan_batch
from tests.unit.test_indexer_plan import event

KEY = ("workspace:w", "mem:a")


def partial(version: str = "ver:2", sequence: int = 2, digest: str = "sha256:projection", erased: bool = True,
            ) -> bytes:
    return event("object_redacted", version=version, sequence=sequence, availability="partially_redacted",
                 digest=digest, redaction={"erased": erased, "pointers": ["/statement"]})


def test_a_partial_redaction_erases_the_old_vectors_and_embeds_the_projection() -> None:
    for erased in (True, False):  # a suppression must not leave the old vectors either
        plan = plan_batch([(1, event("object_created")), (2, partial(erased=erased))])
        assert plan.erased == {KEY}
        version = plan.versions[KEY]
        assert (version.version_id, version.content_digest, version.ledger_sequence) == (
            "ver:2", "sha256:projection", 2)


def test_a_partial_redaction_alone_in_its_batch_still_erases() -> None:
    plan = plan_batch([(7, partial())])
    assert plan.erased == {KEY} and plan.versions[KEY].version_id == "ver:2"


def test_a_version_after_a_partial_redaction_in_the_same_batch_keeps_the_erasure() -> None:
    plan = plan_batch([(1, partial()), (2, event("validation_transitioned", version="ver:3", sequence=3,
                                                 availability="partially_redacted", digest="sha256:projection"))])
    assert plan.erased == {KEY} and plan.versions[KEY].version_id == "ver:3"


def test_a_full_redaction_after_a_partial_one_leaves_nothing_to_embed() -> None:
    plan = plan_batch([(1, partial()), (2, event("object_redacted", version="ver:3", sequence=3,
                                                 availability="redacted", digest=None))])
    assert plan.erased == {KEY} and plan.versions == {}


def test_relationship_events_are_not_embedded_and_do_not_stop_the_fold() -> None:
    """A relationship's envelope has no object_type; its events must not make the indexer stuck."""
    relationship = msgspec.json.encode({
        "event_type": "relationship_created", "scope_id": "workspace:w", "relationship_id": "rel:1",
        "payload": {"content_digest": "sha256:r", "envelope": {"relationship_id": "rel:1", "version_id": "ver:r",
                                                               "sequence": 1, "availability_state": "available"}}})
    filed = msgspec.json.encode({  # defensively: one that names the relationship as its object_id
        "event_type": "object_deleted", "scope_id": "workspace:w", "object_id": "rel:1",
        "payload": {"envelope": {"version_id": "ver:r2", "sequence": 2, "availability_state": "deleted"}}})
    plan = plan_batch([(1, event("object_created")), (2, relationship), (3, filed)])
    assert set(plan.versions) == {KEY} and plan.erased == set()
