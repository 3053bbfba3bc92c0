"""The tunables an operator sets: read from PAMLEDGER_<GROUP>__<NAME>, refused out of range, defaults kept.

Why: these were module constants only a test could change; now they are settings, and a typo'd or absurd
value must stop the process at start rather than surface as a stall later."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from infra.settings import Settings

TUNABLES = {  # environment variable -> (group, field, a valid value other than the default)
    "PAMLEDGER_WRITER__TAIL_CHECK_ROWS": ("writer", "tail_check_rows", 64),
    "PAMLEDGER_WRITER__STREAM_CHECK_SECONDS": ("writer", "stream_check_seconds", 0.5),
    "PAMLEDGER_QUERY__MAX_REQUEST_BYTES": ("query", "max_request_bytes", 131_072),
    "PAMLEDGER_QUERY__MAX_IN_FLIGHT": ("query", "max_in_flight", 32),
    "PAMLEDGER_QUERY__STOP_GRACE_SECONDS": ("query", "stop_grace_seconds", 5.0),
    "PAMLEDGER_FOLLOWER__LINGER_SECONDS": ("follower", "linger_seconds", 0.05),
    "PAMLEDGER_FOLLOWER__MAX_ACK_PENDING": ("follower", "max_ack_pending", 1000),
    "PAMLEDGER_FOLLOWER__ACK_EVERY_SECONDS": ("follower", "ack_every_seconds", 0.5),
    "PAMLEDGER_FOLLOWER__IDLE_CHECK_SECONDS": ("follower", "idle_check_seconds", 10.0),
    "PAMLEDGER_GATEWAY__FLUSH_SECONDS": ("gateway", "flush_seconds", 2.0),
    "PAMLEDGER_GATEWAY__LIVE_BUFFER_EVENTS": ("gateway", "live_buffer_events", 500),
    "PAMLEDGER_GATEWAY__READER_IDLE_SECONDS": ("gateway", "reader_idle_seconds", 30.0),
    "PAMLEDGER_GATEWAY__FEED_PAUSE_AFTER_SECONDS": ("gateway", "feed_pause_after_seconds", 60.0),
    "PAMLEDGER_INDEXER__DEFAULT_SPACE": ("indexer", "default_space", "hashing-64"),
    "PAMLEDGER_INDEXER__MODEL_THREADS": ("indexer", "model_threads", 2),
    "PAMLEDGER_INDEXER__NICE": ("indexer", "nice", 0),
    "PAMLEDGER_MCP__TRANSPORT": ("mcp", "transport", "http"),
    "PAMLEDGER_MCP__PORT": ("mcp", "port", 9000),
    "PAMLEDGER_MCP__TOOLS": ("mcp", "tools", "core"),
    "PAMLEDGER_INDEXER__OUTBOX_BATCH": ("indexer", "outbox_batch", 500),
    "PAMLEDGER_INDEXER__REBUILD_BATCH": ("indexer", "rebuild_batch", 256),
}
OUT_OF_RANGE = {
    "PAMLEDGER_INDEXER__NICE": "20",
    "PAMLEDGER_MCP__PORT": "70000",
    "PAMLEDGER_MCP__TRANSPORT": "carrier-pigeon",
    "PAMLEDGER_WRITER__TAIL_CHECK_ROWS": "0",
    "PAMLEDGER_WRITER__STREAM_CHECK_SECONDS": "0",
    "PAMLEDGER_QUERY__MAX_REQUEST_BYTES": "2000000",  # past NATS's own 1 MiB message limit
    "PAMLEDGER_QUERY__MAX_IN_FLIGHT": "0",
    "PAMLEDGER_QUERY__STOP_GRACE_SECONDS": "-1",
    "PAMLEDGER_FOLLOWER__LINGER_SECONDS": "5",
    "PAMLEDGER_FOLLOWER__MAX_ACK_PENDING": "1",
    "PAMLEDGER_FOLLOWER__ACK_EVERY_SECONDS": "0",
    "PAMLEDGER_FOLLOWER__IDLE_CHECK_SECONDS": "0",
    "PAMLEDGER_GATEWAY__FLUSH_SECONDS": "0",
    "PAMLEDGER_GATEWAY__LIVE_BUFFER_EVENTS": "0",
    "PAMLEDGER_GATEWAY__READER_IDLE_SECONDS": "0.5",
    "PAMLEDGER_GATEWAY__FEED_PAUSE_AFTER_SECONDS": "-3",
    "PAMLEDGER_INDEXER__DEFAULT_SPACE": "hashing-2001",  # minilm or hashing-N (1..2000) only
    "PAMLEDGER_INDEXER__OUTBOX_BATCH": "0",
}


@pytest.fixture(autouse=True)
def clean_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in [*TUNABLES, "PAMLEDGER_QUERY__MAX_INFLIGHT"]:
        monkeypatch.delenv(name, raising=False)


@pytest.mark.parametrize("variable", sorted(TUNABLES))
def test_each_tunable_is_read_from_its_nested_environment_variable(variable: str,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    group, field, value = TUNABLES[variable]
    assert getattr(getattr(Settings(), group), field) != value, "pick a value other than the default"
    monkeypatch.setenv(variable, str(value))
    assert getattr(getattr(Settings(), group), field) == value


@pytest.mark.parametrize("variable", sorted(OUT_OF_RANGE))
def test_a_tunable_out_of_range_is_refused_at_start(variable: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(variable, OUT_OF_RANGE[variable])
    with pytest.raises(ValidationError) as err:
        Settings()
    assert TUNABLES[variable][1] in str(err.value)


def test_the_defaults_are_the_values_the_service_was_tuned_with() -> None:
    settings = Settings()
    assert (settings.query.max_in_flight, settings.query.max_request_bytes, settings.query.stop_grace_seconds) == (
        256, 65_536, 2.0)
    assert (settings.follower.linger_seconds, settings.follower.max_ack_pending, settings.follower.ack_every_seconds,
            settings.follower.idle_check_seconds) == (0.01, 20_000, 1.0, 2.0)
    assert (settings.gateway.flush_seconds, settings.gateway.live_buffer_events, settings.gateway.reader_idle_seconds,
            settings.gateway.feed_pause_after_seconds) == (0.5, 20_000, 120.0, 10.0)
    assert settings.writer.tail_check_rows == 16


def test_a_misspelt_tunable_is_refused_rather_than_ignored(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PAMLEDGER_QUERY__MAX_INFLIGHT", "10")
    with pytest.raises(ValidationError) as err:
        Settings()
    assert "max_inflight" in str(err.value)


@pytest.mark.parametrize(("variable", "value"), [("PAMLEDGER_LOG_LEVEL", "loud"), ("PAMLEDGER_LOG_FORMAT", "fancy")])
def test_a_log_setting_out_of_its_list_is_refused_naming_the_variable(
        monkeypatch: pytest.MonkeyPatch, variable: str, value: str) -> None:
    """A log level it did not know used to end as internal_error (a KeyError), an unknown format was taken
    silently; the CLI turns the refusal into invalid_request naming the variable (pamledger_client.cli_errors)."""
    from pamledger.cli_errors import _bad_settings

    monkeypatch.setenv(variable, value)
    with pytest.raises(ValidationError) as refused:
        Settings()
    error = _bad_settings(refused.value)
    assert error.code == "invalid_request" and variable in error.message and value not in error.message


def test_log_settings_take_any_case(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PAMLEDGER_LOG_LEVEL", "DEBUG")
    monkeypatch.setenv("PAMLEDGER_LOG_FORMAT", "JSON")
    assert (Settings().log_level, Settings().log_format) == ("debug", "json")
