"""The first administrative token is shown once on a terminal and never in a JSON line (where captured logs
would keep it): `run` and `up` print what prepare_credentials returns as JSON."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from authz.bootstrap import read_token
from infra.settings import AuthSettings, Settings
from pamledger.auth import prepare_credentials, show_on_terminal


def test_the_new_admin_token_is_not_in_what_run_prints(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    settings = Settings(state_dir=tmp_path, auth=AuthSettings(mode="enforce"))
    first = prepare_credentials(settings)
    token = read_token(Path(first["admin_token_file"]))
    assert token and first["admin_token_made"] is True
    assert token not in json.dumps(first)
    assert token not in capsys.readouterr().err  # stderr is no terminal here: not shown at all
    again = prepare_credentials(settings)
    assert again["admin_token_made"] is False and read_token(Path(again["admin_token_file"])) == token


def test_a_token_is_shown_only_on_a_terminal(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    assert show_on_terminal("pam_t_secret", tmp_path / "admin.token") is False
    assert "pam_t_secret" not in capsys.readouterr().err
    monkeypatch.setattr("sys.stderr.isatty", lambda: True)
    assert show_on_terminal("pam_t_secret", tmp_path / "admin.token") is True
    shown = capsys.readouterr().err
    assert "pam_t_secret" in shown and not shown.lstrip().startswith("{")
