"""The client's configuration (pamledger_client.config) reads the server's names and defaults, and the
protocol's shared vocabulary matches what the server's request types do with it."""

from __future__ import annotations

from pathlib import Path

import pytest

from infra.settings import Settings
from pamledger.cli_dispatch import client_config
from pamledger_client.config import ClientConfig
from pamledger_client.errors import PamspecError
from pamledger_client.protocol.vocabulary import TRUSTED_STATES
from schemas.queries import QueryRequest


def test_the_defaults_are_the_servers() -> None:
    """Nothing set: the same state dir, prefix and timeout as the server's settings."""
    server, client = Settings(_env_file=None), ClientConfig.from_env({})  # type: ignore[call-arg]
    assert (client.state_dir, client.subject_prefix, client.request_timeout_seconds) == (
        server.state_dir, server.subject_prefix, server.request_timeout_seconds)
    assert client.admin_token_path == server.state_dir / "admin.token"


def test_the_environment_names_are_the_servers(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    env = {"PAMLEDGER_NATS_URL": "nats://a:1,nats://b:2", "PAMLEDGER_TOKEN": "t", "PAMLEDGER_STATE_DIR": str(tmp_path),
           "PAMLEDGER_SUBJECT_PREFIX": "p", "PAMLEDGER_REQUEST_TIMEOUT_SECONDS": "2.5",
           "PAMLEDGER_AUTH__NATS_TLS_CA": "/ca.pem", "pamledger_auth__admin_token_file": "/admin"}
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    assert ClientConfig.from_env() == client_config(Settings()) == ClientConfig(
        nats_url="nats://a:1,nats://b:2", token="t", state_dir=tmp_path, subject_prefix="p",
        request_timeout_seconds=2.5, nats_tls_ca=Path("/ca.pem"), admin_token_file=Path("/admin"))


@pytest.mark.parametrize("value", ["soon", "0", "-1", "nan", "inf"])
def test_a_bad_timeout_is_invalid_request_naming_its_variable(value: str) -> None:
    with pytest.raises(PamspecError) as caught:
        ClientConfig.from_env({"PAMLEDGER_REQUEST_TIMEOUT_SECONDS": value})
    assert caught.value.code == "invalid_request"
    assert caught.value.details["settings"][0]["setting"] == "PAMLEDGER_REQUEST_TIMEOUT_SECONDS"


def test_no_url_anywhere_is_service_unavailable_naming_the_state_dir(tmp_path: Path) -> None:
    with pytest.raises(PamspecError) as caught:
        ClientConfig(state_dir=tmp_path).find_nats_url()
    assert caught.value.code == "service_unavailable" and caught.value.details == {"state_dir": str(tmp_path)}
    (tmp_path / "servers.json").write_text('{"nats_url": "nats://127.0.0.1:9"}')
    assert ClientConfig(state_dir=tmp_path).find_nats_url() == "nats://127.0.0.1:9"


def test_a_token_file_that_holds_no_token_is_no_token(tmp_path: Path) -> None:
    (tmp_path / "admin.token").write_text("not a token\n")
    assert ClientConfig(state_dir=tmp_path).find_token() is None
    token = "pam_0123456789abcdef_" + "A" * 43
    (tmp_path / "admin.token").write_text(token + "\n")
    assert ClientConfig(state_dir=tmp_path).find_token() == token


def test_the_trusted_states_are_the_query_defaults() -> None:
    request = QueryRequest(scope_id="workspace:x")
    assert {dimension: tuple(getattr(request, f"{dimension}_states")) for dimension in TRUSTED_STATES} == TRUSTED_STATES


@pytest.mark.parametrize("text", [
    "team:a:*=read,query", "*=*", "team:a=validate", "team:a:*=obliterate", "te am=read", "a*b=read", "=read",
    "team:a=", "team:a,team:b=create,read", "x" * 513 + "=read", "team:\x00=read", "team:a=read,,query",
])
def test_the_clients_grant_check_agrees_with_the_servers(text: str) -> None:
    """parse_grant (client side, before anything is sent) accepts exactly what schemas.auth.ScopeGrant does."""
    import msgspec

    from pamledger_client.admin import parse_grant
    from schemas.auth import ScopeGrant

    scopes, _, operations = text.partition("=")
    try:
        msgspec.convert({"scopes": scopes.split(","), "operations": operations.split(",")}, ScopeGrant)
        server_accepts = True
    except msgspec.ValidationError:
        server_accepts = False
    try:
        parse_grant(text)
        client_accepts = True
    except ValueError:
        client_accepts = False
    assert client_accepts == server_accepts
