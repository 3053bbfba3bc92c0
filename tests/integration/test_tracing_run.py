"""`pamledger run` with OTEL_EXPORTER_OTLP_ENDPOINT: one create is one trace across the real processes.

The role processes post OTLP/HTTP protobuf to a small receiver in this test, which decodes what they send;
the SDK's span is recorded here. Every server span of the create must carry the SDK's trace id and hang
off its parent across NATS: SDK -> writer (command, decide, commit) -> relay -> projector and indexer apply.
"""

from __future__ import annotations

import asyncio
import gzip
import signal
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, NamedTuple

import pytest
from opentelemetry import trace
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from pamledger_client.client import MemoryClient
from tests.conftest import ACTOR, PROVENANCE, Env, answers, service_environment, wait_for

ROOT = Path(__file__).resolve().parents[2]
SCOPE = "workspace:traced-run"


class Received(NamedTuple):
    service: str
    name: str
    trace_id: int
    span_id: int
    parent_id: int | None


class Collector:
    """An OTLP/HTTP traces endpoint on a free port: keeps every span posted to /v1/traces."""

    def __init__(self) -> None:
        self.spans: list[Received] = []
        self.paths: set[str] = set()
        collector = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - the http.server hook's name
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                if self.headers.get("Content-Encoding") == "gzip":
                    body = gzip.decompress(body)
                collector.paths.add(self.path)
                collector.take(ExportTraceServiceRequest.FromString(body))
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"

    def take(self, request: ExportTraceServiceRequest) -> None:
        for resource in request.resource_spans:
            service = next((a.value.string_value for a in resource.resource.attributes if a.key == "service.name"), "")
            for scope in resource.scope_spans:
                for span in scope.spans:
                    parent = int.from_bytes(span.parent_span_id, "big") if span.parent_span_id else None
                    self.spans.append(Received(service, span.name, int.from_bytes(span.trace_id, "big"),
                                               int.from_bytes(span.span_id, "big"), parent))


@pytest.fixture
def collector() -> Iterator[Collector]:
    found = Collector()
    thread = threading.Thread(target=found.server.serve_forever, daemon=True)
    thread.start()
    yield found
    found.server.shutdown()
    found.server.server_close()


def one(spans: list[Received], service: str, name: str) -> Received:
    matching = [s for s in spans if (s.service, s.name) == (service, name)]
    assert len(matching) == 1, (service, name, spans)
    return matching[0]


async def test_one_create_is_one_trace_across_the_role_processes(env: Env, collector: Collector) -> None:
    provider = trace.get_tracer_provider()
    if not isinstance(provider, TracerProvider):
        trace.set_tracer_provider(TracerProvider())
        provider = trace.get_tracer_provider()
    assert isinstance(provider, TracerProvider)
    here = InMemorySpanExporter()  # the SDK's own span, recorded in this process
    provider.add_span_processor(SimpleSpanProcessor(here))
    environment = service_environment(env, OTEL_EXPORTER_OTLP_ENDPOINT=collector.url, OTEL_BSP_SCHEDULE_DELAY="100")
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "pamledger", "run", cwd=ROOT, env=environment,
        stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.DEVNULL)
    try:
        client = await MemoryClient.connect(env.nats_url, env.settings.subject_prefix)
        try:
            await wait_for(lambda: answers(client, ("writer", "query", "projector", "indexer")), timeout=120)
            await client.create_scope(SCOPE)
            with trace.get_tracer("test").start_as_current_span("agent step") as root:
                made = await client.create(SCOPE, "claim", {"statement": "traced across processes"}, ACTOR,
                                           PROVENANCE)
        finally:
            await client.close()
        trace_id = root.get_span_context().trace_id
        followers = {("pamledger-projector", "projector.apply"), ("pamledger-indexer", "indexer.apply")}

        def mine() -> list[Received]:
            return [s for s in collector.spans if s.trace_id == trace_id]

        await wait_for(lambda: followers <= {(s.service, s.name) for s in mine()}, timeout=60)
    finally:
        proc.send_signal(signal.SIGINT)
        await asyncio.wait_for(proc.wait(), 60)
    spans = mine()
    assert collector.paths == {"/v1/traces"}
    command = one(spans, "pamledger-writer", "command")
    relay = one(spans, "pamledger-writer", "relay.publish")
    [sdk] = [s for s in here.get_finished_spans() if s.name == "pamledger.cmd"
             and s.context.trace_id == trace_id]
    assert sdk.parent is not None and sdk.parent.span_id == root.get_span_context().span_id
    assert command.parent_id == sdk.context.span_id  # across NATS: the request's traceparent
    for name in ("decide", "commit", "relay.publish"):
        assert one(spans, "pamledger-writer", name).parent_id == command.span_id
    for service, name in followers:
        assert one(spans, service, name).parent_id == relay.span_id
    assert made["ledger_sequence"] > 0
