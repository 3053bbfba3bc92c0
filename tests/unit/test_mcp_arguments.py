"""Tool arguments become the NATS binding's bodies: defaults for who acts and provenance, derived idempotency
keys, PAMSPEC's query names mapped to ours, resource URIs parsed. Tables over the pure functions."""

from __future__ import annotations

from typing import Any

import pytest

from mcp_binding.arguments import (
    derived_key,
    history_call,
    mapped_filters,
    query_call,
    related_body,
    subscription_open,
    write_body,
)
from mcp_binding.resources import Target, events_uri, parse
from pamledger_client.errors import PamspecError

ME = {"actor_id": "actor:agent:me", "actor_kind": "agent"}
CREATE = {"scope_id": "workspace:a", "object_type": "claim", "canonical_content": {"s": 1}}


def test_a_write_without_a_key_gets_one_derived_from_actor_tool_and_arguments() -> None:
    command, body, key = write_body("pamspec.create", CREATE, ME)
    assert command == "create" and body["idempotency_key"] == key and key.startswith("mcp:")
    assert write_body("pamspec.create", dict(CREATE), ME)[2] == key  # the same call, the same key
    assert write_body("pamspec.create", {**CREATE, "canonical_content": {"s": 2}}, ME)[2] != key
    assert write_body("pamspec.create", CREATE, {**ME, "actor_id": "actor:agent:you"})[2] != key
    assert derived_key(ME["actor_id"], "pamspec.update", CREATE) != key


def test_a_retried_call_sends_the_same_body_so_the_writer_replays_it() -> None:
    assert write_body("pamspec.create", CREATE, ME)[1] == write_body("pamspec.create", CREATE, ME)[1]


def test_the_callers_key_actor_and_provenance_are_kept_verbatim() -> None:
    given = {**CREATE, "idempotency_key": "k-1", "actor": {"actor_id": "actor:x", "actor_kind": "agent"},
             "provenance": {"provenance_id": "prov:x", "actor": {"actor_id": "actor:x", "actor_kind": "agent"},
                            "activity": "mine"}}
    _, body, key = write_body("pamspec.create", given, ME)
    assert key == "k-1" and body == given


def test_defaults_name_the_token_actor_and_the_tool_call() -> None:
    _, body, key = write_body("pamspec.create", CREATE, ME)
    assert body["actor"] == ME
    assert body["provenance"] == {"provenance_id": f"prov:{key}", "actor": ME, "activity": "mcp.tool_call:pamspec.create"}
    assert write_body("pamspec.relate", {"scope_id": "s:a", "source_object_id": "o:a", "target_object_id": "o:b",
                                         "relationship_type": "supports"}, ME)[1]["directionality"] == "directed"
    grant = write_body("pamledger.grant_delegation", {"scope_id": "s:a"}, ME)[1]
    assert grant["granting_actor"] == ME and "provenance" not in grant
    assert write_body("pamledger.check_delegation", {"scope_id": "s:a"}, ME)[1]["delegated_actor_id"] == ME["actor_id"]


@pytest.mark.parametrize("filters, ours", [
    ({"object_type": ["claim"], "validation_state": ["unverified"]},
     {"object_types": ["claim"], "validation_states": ["unverified"]}),
    ({"object_type": "claim"}, {"object_types": ["claim"]}),  # one string where a list is meant
    ({"provenance_id": ["prov:a"], "lifecycle_state": ["active"], "availability_state": ["available"],
      "retention_state": ["retained"]},
     {"provenance_ids": ["prov:a"], "lifecycle_states": ["active"], "availability_states": ["available"],
      "retention_states": ["retained"]}),
    ({"object_types": ["claim"], "time": {"observed_at": {"gte": "2026-01-01T00:00:00Z"}}},
     {"object_types": ["claim"], "time": {"observed_at": {"gte": "2026-01-01T00:00:00Z"}}}),
])
def test_pamspec_filter_names_map_to_ours(filters: dict[str, Any], ours: dict[str, Any]) -> None:
    assert mapped_filters(filters) == ours


@pytest.mark.parametrize("filters, field", [
    ({"colour": ["blue"]}, "filters/colour"),
    ({"relationship_type": ["supports"]}, "filters/relationship_type"),
    ({"object_type": ["a"], "object_types": ["b"]}, "filters/object_types"),
])
def test_filters_we_cannot_honour_are_refused_by_name(filters: dict[str, Any], field: str) -> None:
    with pytest.raises(PamspecError) as refused:
        mapped_filters(filters)
    assert refused.value.code == "invalid_request" and refused.value.details["field"] == field


def test_a_query_with_semantic_is_a_search_in_the_named_space() -> None:
    kind, body = query_call({"scope_id": "s:a", "semantic": {"text": "kettle"}, "embedding_space_id": "space:x",
                             "filters": {"object_type": "claim"}, "limit": 3})
    assert kind == "search"
    assert body == {"scope_id": "s:a", "mode": "semantic", "text": "kettle", "embedding_space_id": "space:x",
                    "limit": 3, "object_types": ["claim"]}
    assert query_call({"scope_id": "s:a", "cursor": "c", "filters": {"text": "x"}}) == (
        "query", {"scope_id": "s:a", "text": "x", "cursor": "c"})
    with pytest.raises(PamspecError):
        query_call({"scope_id": "s:a", "semantic": {"text": "x"}, "cursor": "c"})
    with pytest.raises(PamspecError):
        query_call({"scope_id": "s:a", "semantic": {"txt": "x"}})


def test_a_semantic_query_at_a_snapshot_is_a_search_at_that_snapshot() -> None:
    assert query_call({"scope_id": "s:a", "semantic": {"text": "kettle", "mode": "hybrid"},
                       "snapshot_id": "snap:one"}) == (
        "search", {"scope_id": "s:a", "mode": "hybrid", "text": "kettle", "snapshot_id": "snap:one"})


def test_subscribe_maps_start_sequence_and_polls() -> None:
    body = subscription_open({"scope_id": "s:a", "start_sequence": 7}, ME, "op:mcp-1")
    assert body == {"scope_id": "s:a", "actor": ME, "filter": {}, "delivery": {"mode": "poll"},
                    "after_sequence": 7, "operation_id": "op:mcp-1"}
    with pytest.raises(PamspecError):
        subscription_open({"scope_id": "s:a", "delivery": {"mode": "push"}}, ME, "op:mcp-2")


@pytest.mark.parametrize("uri, target", [
    ("pamspec://manifest", Target("manifest")),
    ("pamspec://scope/workspace:a", Target("scope", "workspace:a")),
    ("pamspec://scope/workspace%3Aa/object/mem%3Ax", Target("object", "workspace:a", "mem:x")),
    ("pamspec://scope/team%2Fa:b/object/mem:x/version/ver:y", Target("version", "team/a:b", "mem:x", "ver:y")),
    ("pamspec://scope/workspace:a/events", Target("events", "workspace:a")),
    ("pamspec://scope/workspace:a/events?after_sequence=42", Target("events", "workspace:a", after_sequence=42)),
])
def test_resource_uris_name_their_target(uri: str, target: Target) -> None:
    assert parse(uri) == target


@pytest.mark.parametrize("uri", ["pamspec://scope", "pamspec://scope/a:b/objects/x", "https://scope/a:b",
                                 "pamspec://scope//object/x", "pamspec://scope/a:b/events?after_sequence=-1",
                                 "pamspec://scope/a:b/events?after_sequence=ten"])
def test_other_uris_are_invalid_request(uri: str) -> None:
    with pytest.raises(PamspecError) as refused:
        parse(uri)
    assert refused.value.code == "invalid_request"


def test_an_events_uri_round_trips_a_scope_with_a_slash() -> None:
    assert parse(events_uri("team/a:b")) == Target("events", "team/a:b")


def test_a_space_without_a_semantic_query_is_refused_not_dropped() -> None:
    with pytest.raises(PamspecError) as refused:
        query_call({"scope_id": "s:a", "embedding_space_id": "space:x"})
    assert refused.value.details["field"] == "embedding_space_id"


def test_history_is_one_objects_or_a_page_of_the_scopes_events() -> None:
    assert history_call({"scope_id": "s:a", "object_id": "mem:x", "operation_id": "op:1", "after_sequence": 3}) == (
        "history", {"scope_id": "s:a", "object_id": "mem:x", "operation_id": "op:1"})
    assert history_call({"scope_id": "s:a", "after_sequence": 3, "event_classes": []}) == (
        "events", {"scope_id": "s:a", "after_sequence": 3})
    assert history_call({"scope_id": "s:a", "event_classes": ["object_created"]}) == (
        "events", {"scope_id": "s:a", "event_classes": ["object_created"]})


def test_related_starts_from_the_named_object() -> None:
    assert related_body({"scope_id": "s:a", "object_id": "mem:x", "hops": 2}) == {
        "scope_id": "s:a", "from_object_id": "mem:x", "hops": 2}
