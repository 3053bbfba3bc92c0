"""Traces across NATS: one create sent by the SDK inside a span is one trace through the writer, the relay,
the projector and the indexer; a query is one trace through the query service; off, nothing is recorded and
no `traceparent` travels.

The roles run in this process (tests.conftest.serving) but meet only over the real NATS server, so every
parent link below crossed a NATS message: the SDK's request, the relay's ledger message.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Iterator
from typing import Any

import msgspec
import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from infra import tracing
from pamledger_client.protocol.subjects import command_subject, partition_wildcard
from pamledger.supervisor import ROLES as ALL_ROLES
from tests.conftest import ACTOR, PROVENANCE, Env, serving, wait_for

SCOPE = "workspace:tracing"
WRITER_SPANS = {"command", "decide", "commit"}


@pytest.fixture(scope="module")
def exporter() -> Iterator[InMemorySpanExporter]:
    """Spans of this process (SDK and every role) kept in memory; tracing off again afterwards."""
    provider = trace.get_tracer_provider()
    if not isinstance(provider, TracerProvider):  # the first module to trace sets the global provider
        trace.set_tracer_provider(TracerProvider())
        provider = trace.get_tracer_provider()
    assert isinstance(provider, TracerProvider)
    found = InMemorySpanExporter()
    processor = SimpleSpanProcessor(found)
    provider.add_span_processor(processor)
    yield found
    tracing.uninstall()
    found.clear()


@pytest.fixture(scope="module")
async def client(env: Env, exporter: InMemorySpanExporter) -> AsyncIterator[Any]:
    async with serving(env, ALL_ROLES, roles=ALL_ROLES) as client:
        await client.create_scope(SCOPE)
        yield client


def in_trace(exporter: InMemorySpanExporter, trace_id: int) -> list[ReadableSpan]:
    return [s for s in exporter.get_finished_spans() if s.context.trace_id == trace_id]


def named(spans: list[ReadableSpan], name: str) -> ReadableSpan:
    matching = [s for s in spans if s.name == name]
    assert len(matching) == 1, (name, [s.name for s in spans])
    return matching[0]


def parent_of(span: ReadableSpan) -> int | None:
    return span.parent.span_id if span.parent is not None else None


async def test_one_create_is_one_trace_from_the_sdk_to_the_followers(client: Any,
                                                                      exporter: InMemorySpanExporter) -> None:
    tracing.install(trace.get_tracer_provider())
    exporter.clear()
    with trace.get_tracer("test").start_as_current_span("agent step") as root:
        made = await client.create(SCOPE, "claim", {"statement": "traced"}, ACTOR, PROVENANCE)
    trace_id = root.get_span_context().trace_id
    followers = {"projector.apply", "indexer.apply"}
    spans = await wait_for(lambda: (found := in_trace(exporter, trace_id))
                           and followers <= {s.name for s in found} and found, timeout=30)

    sdk = named(spans, "pamledger.cmd")
    command = named(spans, "command")
    relay = named(spans, "relay.publish")
    assert parent_of(sdk) == root.get_span_context().span_id
    assert parent_of(command) == sdk.context.span_id  # crossed NATS: the request's traceparent
    assert {parent_of(named(spans, n)) for n in ("decide", "commit", "relay.publish")} == {command.context.span_id}
    for name in followers:  # crossed NATS again: the ledger message's traceparent
        apply = named(spans, name)
        assert parent_of(apply) == relay.context.span_id
        assert apply.attributes["pamledger.ledger_sequence"] == made["ledger_sequence"]
    assert command.attributes["pamledger.command"] == "create"
    assert command.attributes["pamledger.outcome"] == "committed"
    assert named(spans, "commit").attributes["pamledger.ledger_sequence"] >= made["ledger_sequence"]
    for span in spans:  # no ids and no content in names or attributes
        assert SCOPE not in span.name and made["object_id"] not in str(dict(span.attributes or {}))
        assert "traced" not in str(dict(span.attributes or {}))


async def test_a_command_without_an_operation_id_still_reaches_the_followers(env: Env, client: Any,
                                                                            exporter: InMemorySpanExporter) -> None:
    """The service assigns the operation id its ledger rows carry: the relay finds the command's span by it."""
    tracing.install(trace.get_tracer_provider())
    exporter.clear()
    with trace.get_tracer("test").start_as_current_span("caller") as caller:
        header = tracing.traceparent(caller)
    body = {"scope_id": SCOPE, "object_type": "claim", "canonical_content": {"statement": "no operation id"},
            "actor": ACTOR, "provenance": PROVENANCE}
    reply = await client.nc.request(command_subject(env.settings.subject_prefix, "create"),
                                    msgspec.json.encode(body), timeout=10, headers=header)
    sequence = msgspec.json.decode(reply.data)["result"]["ledger_sequence"]
    trace_id = caller.get_span_context().trace_id
    spans = await wait_for(lambda: (found := in_trace(exporter, trace_id))
                           and "projector.apply" in {s.name for s in found} and found, timeout=30)
    assert parent_of(named(spans, "command")) == caller.get_span_context().span_id
    assert named(spans, "projector.apply").attributes["pamledger.ledger_sequence"] == sequence


async def test_a_query_is_one_trace_through_the_query_service(client: Any, exporter: InMemorySpanExporter) -> None:
    tracing.install(trace.get_tracer_provider())
    exporter.clear()
    with trace.get_tracer("test").start_as_current_span("agent step") as root:
        await client.query(SCOPE)
    spans = in_trace(exporter, root.get_span_context().trace_id)
    sdk = named(spans, "pamledger.query")
    assert parent_of(named(spans, "query.query")) == sdk.context.span_id
    assert named(spans, "query.query").attributes["pamledger.outcome"] == "ok"


async def test_a_request_without_a_span_starts_a_trace_at_the_service(client: Any,
                                                                     exporter: InMemorySpanExporter) -> None:
    tracing.install(trace.get_tracer_provider())
    exporter.clear()
    await client.query(SCOPE)
    [span] = [s for s in exporter.get_finished_spans() if s.name == "query.query"]
    assert span.parent is None and not [s for s in exporter.get_finished_spans() if s.name.startswith("pamledger.")]


async def test_off_nothing_is_recorded_and_no_traceparent_travels(env: Env, client: Any,
                                                                  exporter: InMemorySpanExporter) -> None:
    tracing.uninstall()
    exporter.clear()
    off_since = time.time_ns()  # a span the roles started before (an indexer's own command) may still end after
    seen: list[dict[str, str]] = []

    async def keep(msg: Any) -> None:
        seen.append(dict(msg.headers or {}))

    prefix = env.settings.subject_prefix
    commands = await client.nc.subscribe(command_subject(prefix, "create"), cb=keep)
    ledger = await client.nc.subscribe(partition_wildcard(prefix, 0), cb=keep)
    try:
        made = await client.create(SCOPE, "claim", {"statement": "untraced"}, ACTOR, PROVENANCE)
        await wait_for(lambda: any(h.get("Pam-Ledger-Sequence") == str(made["ledger_sequence"]) for h in seen))
        await client.query(SCOPE)
    finally:
        await commands.unsubscribe()
        await ledger.unsubscribe()
    assert seen and all(tracing.TRACEPARENT not in headers for headers in seen)
    assert [span.name for span in exporter.get_finished_spans() if (span.start_time or 0) >= off_since] == []


async def test_a_live_push_continues_the_trace_of_the_create_it_delivers(client: Any,
                                                                         exporter: InMemorySpanExporter) -> None:
    """The gateway's push is a `gateway.push` span under the relay's publish, and carries its traceparent."""
    tracing.install(trace.get_tracer_provider())
    me = await client.me(ACTOR)
    head = (await client.create(SCOPE, "claim", {"statement": "before"}, ACTOR, PROVENANCE))["ledger_sequence"]
    subscription = await client.subscribe(SCOPE, me, after_sequence=head)
    try:
        pushed = aiter(subscription)
        found: list[ReadableSpan] = []
        for attempt in range(5):  # the first pushes may come from catch-up (no span): until one is live
            exporter.clear()
            with trace.get_tracer("test").start_as_current_span("agent step") as root:
                made = await client.create(SCOPE, "claim", {"statement": f"pushed {attempt}"}, ACTOR, PROVENANCE)
            while (await anext(pushed))["ledger_sequence"] < made["ledger_sequence"]:
                pass
            found = await wait_for(lambda: in_trace(exporter, root.get_span_context().trace_id), timeout=10)
            if "gateway.push" in {s.name for s in found}:
                break
        push = named(found, "gateway.push")
        assert parent_of(push) == named(found, "relay.publish").context.span_id
        assert push.attributes["pamledger.ledger_sequence"] == made["ledger_sequence"]
    finally:
        await subscription.close()


async def test_a_services_own_command_is_a_trace_that_reaches_the_writer(env: Env, client: Any,
                                                                        exporter: InMemorySpanExporter) -> None:
    """What the indexer, the retention evaluator and the gateway send the writer (infra.requester) starts a
    `service.command` trace; the writer's spans join it."""
    from infra.requester import CommandRequester

    tracing.install(trace.get_tracer_provider())
    exporter.clear()
    requester = CommandRequester(client.nc, env.settings.subject_prefix, token=client.token)
    await requester.command("create_scope", {"scope_id": "workspace:tracing-service", "scope_kind": "workspace"})
    # The roles in this process send their own commands too (the indexer's records): find this one by its type.
    [service] = [s for s in exporter.get_finished_spans() if s.name == "service.command"
                 and (s.attributes or {}).get("pamledger.command") == "create_scope"]
    assert service.parent is None
    spans = await wait_for(lambda: (found := in_trace(exporter, service.context.trace_id))
                           and "commit" in {s.name for s in found} and found, timeout=10)
    assert parent_of(named(spans, "command")) == service.context.span_id
