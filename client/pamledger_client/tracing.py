"""The SDK's side of traces: a client span per request, its W3C `traceparent` in the request's NATS headers.

Optional and light: nothing happens unless `opentelemetry` (the API) is importable and the calling code has
a span active (the application traces). The service continues the trace (infra.tracing).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from typing import Any

try:
    from opentelemetry import trace
    from opentelemetry.trace import SpanKind
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
except ImportError:  # the SDK works without it
    trace = None  # type: ignore[assignment]

_propagator: Any = TraceContextTextMapPropagator() if trace is not None else None
_UNTRACED: AbstractContextManager[None] = nullcontext()  # reusable: what an untraced request enters


def request_span(kind: str, name: str, headers: dict[str, str]) -> AbstractContextManager[None]:
    """Around one request (`kind` cmd, query, sub or status; `name` its subject's last token): a client span
    under the caller's active span, and `traceparent` added to `headers`. Without either, nothing is done."""
    if trace is None or not trace.get_current_span().get_span_context().is_valid:
        return _UNTRACED
    return _client_span(kind, name, headers)


@contextmanager
def _client_span(kind: str, name: str, headers: dict[str, str]) -> Iterator[None]:
    tracer = trace.get_tracer("pamledger.client")
    with tracer.start_as_current_span(f"pamledger.{kind}", kind=SpanKind.CLIENT,
                                      attributes={"pamledger.request": name[:64]}):
        _propagator.inject(headers)
        yield
