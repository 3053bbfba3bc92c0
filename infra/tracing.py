"""Traces (OpenTelemetry): one trace per request, from the SDK through NATS to every role it reaches.

Off unless an OTLP endpoint is configured (`OTEL_EXPORTER_OTLP_ENDPOINT`, or the `tracing.endpoint`
setting): then nothing is configured and every hot path pays one check of `ENABLED`, a module global
(bench: `python -m bench write_path`, docs/implementation-report.md). On, each process gets a TracerProvider
with a BatchSpanProcessor and the OTLP/HTTP exporter, its service named by its role (`pamledger-writer`, ...).

The W3C `traceparent` travels in NATS headers only: the SDK puts it on a request, the relay on the
ledger message it publishes (the command's context, never a ledger row: nothing of a trace is in Postgres),
the followers read it from their deliveries. The writer decides and commits a batch of commands at once, so
its spans are recorded after the batch, with the batch's timestamps, once under each command's own span
(`record`): every trace holds its whole story, and `pamledger.batch_size` says how many shared the commit.

Span names are bounded sets (`command`, `decide`, `query.read`, `projector.apply`, ...); attributes carry
the command type, outcome, batch size and ledger sequence, never memory content, scope or object ids.
"""

from __future__ import annotations

import os
from collections import OrderedDict
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any

ENABLED = False  # read by the hot paths: `if tracing.ENABLED:` is all tracing costs when it is off
TRACEPARENT = "traceparent"
ENDPOINT_VARIABLE = "OTEL_EXPORTER_OTLP_ENDPOINT"
_HANDOVER_LIMIT = 10_000  # command contexts awaiting the relay: bounded, the oldest go first

_tracer: Any = None
_provider: Any = None
_propagator: Any = None
_handover: OrderedDict[str, Any] = OrderedDict()  # operation id -> the command span's context (writer -> relay)


def endpoint_of(setting: str | None) -> str | None:
    """Where spans go: the setting, else the standard OpenTelemetry variable; None: tracing is off."""
    return setting or os.environ.get(ENDPOINT_VARIABLE) or None


def service_name(roles: tuple[str, ...] | list[str]) -> str:
    """`pamledger-writer` for a process of one role (what `run` spawns), `pamledger` for several."""
    return f"pamledger-{roles[0]}" if len(roles) == 1 else "pamledger"


def configure(setting: str | None, roles: tuple[str, ...] | list[str]) -> bool:
    """Turn tracing on for this process when an endpoint is configured (once: a second call keeps the first
    provider). Returns whether tracing is on."""
    endpoint = endpoint_of(setting)
    if endpoint is None or ENABLED:
        return ENABLED
    from opentelemetry import trace
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    provider = TracerProvider(resource=Resource.create({"service.name": service_name(roles)}))
    # The variable is a base URL the exporter completes itself; the setting names the base URL too.
    exporter = OTLPSpanExporter(endpoint=f"{endpoint.rstrip('/')}/v1/traces")
    provider.add_span_processor(BatchSpanProcessor(exporter))
    trace.set_tracer_provider(provider)
    install(provider)
    return True


def install(provider: Any) -> None:
    """Record spans with `provider` (configure's, or a test's with an in-memory exporter)."""
    global ENABLED, _tracer, _provider, _propagator
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

    _provider, _tracer, _propagator = provider, provider.get_tracer("pamledger"), TraceContextTextMapPropagator()
    ENABLED = True


def uninstall() -> None:
    """Tracing off again (tests); spans already ended stay with the provider's processors."""
    global ENABLED, _tracer, _provider
    ENABLED, _tracer, _provider = False, None, None
    _handover.clear()


def shutdown() -> None:
    """Export what is buffered (a role process stopping)."""
    if _provider is not None:
        _provider.force_flush()


def parent_of(headers: Mapping[str, str] | None) -> Any:
    """The context a message's `traceparent` header names, or None (no header, or a malformed one)."""
    if not headers or TRACEPARENT not in headers:
        return None
    from opentelemetry import trace

    context = _propagator.extract({TRACEPARENT: headers[TRACEPARENT]})
    return context if trace.get_current_span(context).get_span_context().is_valid else None


def parent_in_block(block: bytes | None) -> Any:
    """parent_of for a raw NATS header block (`infra.nats_raw` deliveries)."""
    if not block or b"traceparent" not in block:
        return None
    from infra.nats_raw import parse_headers

    return parent_of(parse_headers(block))


def traceparent(span: Any) -> dict[str, str]:
    """The header that makes `span` the parent of what a message's receiver does."""
    from opentelemetry import trace

    carrier: dict[str, str] = {}
    _propagator.inject(carrier, trace.set_span_in_context(span))
    return carrier


def record(name: str, parent: Any, start_ns: int, end_ns: int, attributes: Mapping[str, Any]) -> Any:
    """A span that already happened (a batch's step, timed while it ran), under `parent`; returns it ended."""
    span = _tracer.start_span(name, context=parent, start_time=start_ns, attributes=dict(attributes))
    span.end(end_time=end_ns)
    return span


def start(name: str, parent: Any, attributes: Mapping[str, Any]) -> Any:
    """A span that starts now under `parent`; the caller ends it."""
    from opentelemetry.trace import SpanKind

    return _tracer.start_span(name, context=parent, kind=SpanKind.PRODUCER, attributes=dict(attributes))


def context_of(span: Any) -> Any:
    from opentelemetry import trace

    return trace.set_span_in_context(span)


@contextmanager
def span(name: str, parent: Any, attributes: Mapping[str, Any]) -> Iterator[Any]:
    """A span around work done now, under `parent` (None: a new trace)."""
    from opentelemetry.trace import SpanKind

    with _tracer.start_as_current_span(name, context=parent, kind=SpanKind.SERVER,
                                       attributes=dict(attributes)) as current:
        yield current


def hand_over(operation_id: str | None, context: Any) -> None:
    """The writer leaves a committed command's context for the relay (same process), by operation id."""
    if operation_id is None:
        return
    _handover[operation_id] = context
    while len(_handover) > _HANDOVER_LIMIT:
        _handover.popitem(last=False)


def take_over(operation_id: str | None) -> Any:
    """The context the writer left for `operation_id`, or None (catch-up from the ledger: no parent)."""
    return _handover.pop(operation_id, None) if operation_id is not None else None
