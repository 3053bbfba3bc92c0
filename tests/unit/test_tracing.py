"""The pieces of tracing that need no server: where spans go, bounded span names, header handling, and the
SDK without opentelemetry installed."""

from __future__ import annotations

import builtins
import importlib
import sys
from typing import Any

import pytest

from infra import tracing
from infra.request_shell import operation_label

VALID = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"


def test_tracing_is_off_without_an_endpoint(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(tracing.ENDPOINT_VARIABLE, raising=False)
    assert tracing.endpoint_of(None) is None and tracing.configure(None, ["writer"]) is False
    assert tracing.ENABLED is False
    monkeypatch.setenv(tracing.ENDPOINT_VARIABLE, "http://collector:4318")
    assert tracing.endpoint_of(None) == "http://collector:4318"
    assert tracing.endpoint_of("http://setting:4318") == "http://setting:4318"


def test_a_process_of_one_role_is_named_by_it() -> None:
    assert tracing.service_name(["writer"]) == "pamledger-writer"
    assert tracing.service_name(["writer", "query"]) == "pamledger"


def test_span_names_are_bounded_sets() -> None:
    assert operation_label("query.read") == "query.read"
    assert operation_label("query.scope:secret-name") == "query.unknown"
    assert operation_label("sub.open") == "sub.open"
    assert operation_label("sub.anything") == "sub.unknown"
    assert operation_label("other") == "request"


def test_a_missing_or_malformed_traceparent_names_no_parent() -> None:
    from opentelemetry.sdk.trace import TracerProvider

    tracing.install(TracerProvider())
    try:
        assert tracing.parent_of(None) is None and tracing.parent_of({}) is None
        assert tracing.parent_of({"traceparent": "00-zz-yy-01"}) is None
        assert tracing.parent_of({"traceparent": VALID}) is not None
        block = f"NATS/1.0\r\nPam-Ledger-Sequence: 4\r\ntraceparent: {VALID}\r\n\r\n".encode()
        assert tracing.parent_in_block(block) is not None
        assert tracing.parent_in_block(b"NATS/1.0\r\nPam-Ledger-Sequence: 4\r\n\r\n") is None
    finally:
        tracing.uninstall()


def test_the_relay_hand_over_is_bounded_and_taken_once() -> None:
    tracing.hand_over("op:a", "context-a")
    assert tracing.take_over("op:a") == "context-a" and tracing.take_over("op:a") is None
    assert tracing.take_over(None) is None
    for n in range(tracing._HANDOVER_LIMIT + 5):
        tracing.hand_over(f"op:{n}", n)
    assert tracing.take_over("op:0") is None and tracing.take_over(f"op:{tracing._HANDOVER_LIMIT + 4}") is not None
    tracing.uninstall()


def test_the_sdk_sends_no_traceparent_without_an_active_span() -> None:
    from pamledger_client.tracing import request_span

    headers: dict[str, str] = {}
    with request_span("cmd", "create", headers):
        pass
    assert headers == {}


def test_the_sdk_works_without_opentelemetry(monkeypatch: pytest.MonkeyPatch) -> None:
    real_import = builtins.__import__

    def without_opentelemetry(name: str, *args: Any, **kwargs: Any) -> Any:
        if name.startswith("opentelemetry"):
            raise ImportError(name)
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", without_opentelemetry)
    monkeypatch.delitem(sys.modules, "pamledger_client.tracing")
    module = importlib.import_module("pamledger_client.tracing")  # undone after the test: the real one is back
    headers: dict[str, str] = {}
    with module.request_span("cmd", "create", headers):
        pass
    assert module.trace is None and headers == {}
