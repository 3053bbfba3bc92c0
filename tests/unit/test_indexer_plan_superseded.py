"""indexer.plan: a version replaced within one batch by other content is kept (a snapshot sealed while it was
current searches it); one replaced by the same content, or erased later in the batch, is not."""

from __future__ import annotations

from indexer.plan import plan_batch
from tests.unit.test_indexer_plan import event


def test_a_version_replaced_within_the_batch_by_other_content_is_superseded() -> None:
    plan = plan_batch([(5, event("object_created")),
                       (6, event("object_updated", version="ver:2", sequence=2, digest="sha256:y")),
                       (7, event("object_updated", version="ver:3", sequence=3, digest="sha256:z"))])
    assert [(v.version_id, v.content_digest) for v in plan.superseded] == [("ver:1", "sha256:x"),
                                                                          ("ver:2", "sha256:y")]
    assert plan.versions[("workspace:w", "mem:a")].version_id == "ver:3"


def test_a_transition_with_the_same_content_supersedes_nothing() -> None:
    plan = plan_batch([(5, event("object_created")),
                       (6, event("lifecycle_transitioned", version="ver:2", sequence=2))])
    assert plan.superseded == []


def test_an_erasure_later_in_the_batch_drops_what_the_object_had_superseded() -> None:
    plan = plan_batch([(1, event("object_created")),
                       (2, event("object_updated", version="ver:2", sequence=2, digest="sha256:y")),
                       (3, event("object_created", object_id="mem:b", version="ver:b1")),
                       (4, event("object_updated", object_id="mem:b", version="ver:b2", sequence=2, digest="sha256:q")),
                       (5, event("object_redacted", version="ver:3", sequence=3, availability="partially_redacted",
                                 digest="sha256:p"))])
    assert [(v.object_id, v.version_id) for v in plan.superseded] == [("mem:b", "ver:b1")]
    assert plan.versions[("workspace:w", "mem:a")].version_id == "ver:3"  # the permitted projection, embedded
    assert ("workspace:w", "mem:a") in plan.erased
