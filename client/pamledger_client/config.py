"""What the SDK and the client CLI read from the environment: the same `PAMLEDGER_*` names the server reads.

Why not the server's settings: an agent's environment holds only pamledger-client (nats-py and msgspec), so
the few settings a client needs are read here, by the server's names and defaults, and a bad value is the
same `invalid_request` naming its variable.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path

from pamledger_client.errors import PamspecError
from pamledger_client.protocol.local import ADMIN_TOKEN_FILE, DEFAULT_STATE_DIR, SERVERS_FILE, read_servers_file
from pamledger_client.protocol.subjects import DEFAULT_PREFIX
from pamledger_client.protocol.tokens import token_id_or_none

DEFAULT_TIMEOUT_SECONDS = 10.0


@dataclass(frozen=True)
class ClientConfig:
    """Where the service is and how to call it; `from_env()` reads the `PAMLEDGER_*` variables."""

    nats_url: str | None = None  # PAMLEDGER_NATS_URL (a comma-separated list names several servers)
    token: str | None = None  # PAMLEDGER_TOKEN; unset: the state dir's admin.token, if any
    state_dir: Path = DEFAULT_STATE_DIR  # PAMLEDGER_STATE_DIR: where `pamledger up` / `make run` record servers
    subject_prefix: str = DEFAULT_PREFIX  # PAMLEDGER_SUBJECT_PREFIX
    request_timeout_seconds: float = DEFAULT_TIMEOUT_SECONDS  # PAMLEDGER_REQUEST_TIMEOUT_SECONDS
    nats_tls_ca: Path | None = None  # PAMLEDGER_AUTH__NATS_TLS_CA: verify the NATS server against this CA
    admin_token_file: Path | None = None  # PAMLEDGER_AUTH__ADMIN_TOKEN_FILE; default <state_dir>/admin.token

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> ClientConfig:
        """The configuration the environment gives (names as the server reads them, case-insensitively)."""
        env = {key.upper(): value for key, value in (os.environ if environ is None else environ).items()
               if key.upper().startswith("PAMLEDGER_")}
        config = cls()
        text = {name: env[variable] for name, variable in _TEXT.items() if env.get(variable)}
        paths = {name: Path(env[variable]) for name, variable in _PATHS.items() if env.get(variable)}
        config = replace(config, **text, **paths)  # type: ignore[arg-type]
        if env.get("PAMLEDGER_REQUEST_TIMEOUT_SECONDS"):
            config = replace(config, request_timeout_seconds=_seconds(env["PAMLEDGER_REQUEST_TIMEOUT_SECONDS"],
                                                                      "PAMLEDGER_REQUEST_TIMEOUT_SECONDS"))
        return config

    @property
    def admin_token_path(self) -> Path:
        return self.admin_token_file or self.state_dir / ADMIN_TOKEN_FILE

    def find_nats_url(self) -> str:
        """PAMLEDGER_NATS_URL, else the nats_url `pamledger up` / `run` recorded in the state dir."""
        if self.nats_url:
            return self.nats_url
        recorded = read_servers_file(self.state_dir) or {}
        if recorded.get("nats_url"):
            return str(recorded["nats_url"])
        raise PamspecError.of(
            "service_unavailable",
            f"no NATS URL: set PAMLEDGER_NATS_URL, or start the service (`make run` / `pamledger up`) so that "
            f"{self.state_dir / SERVERS_FILE} names it (PAMLEDGER_STATE_DIR picks the state dir)",
            {"state_dir": str(self.state_dir)})

    def find_token(self) -> str | None:
        """PAMLEDGER_TOKEN, else the administrative token `pamledger up` / `run` wrote in the state dir."""
        if self.token:
            return self.token
        try:
            token = self.admin_token_path.read_text().strip()
        except OSError:
            return None
        return token if token_id_or_none(token) is not None else None


_TEXT = {"nats_url": "PAMLEDGER_NATS_URL", "token": "PAMLEDGER_TOKEN", "subject_prefix": "PAMLEDGER_SUBJECT_PREFIX"}
_PATHS = {"state_dir": "PAMLEDGER_STATE_DIR", "nats_tls_ca": "PAMLEDGER_AUTH__NATS_TLS_CA",
          "admin_token_file": "PAMLEDGER_AUTH__ADMIN_TOKEN_FILE"}


def _seconds(text: str, variable: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not math.isfinite(value) or value <= 0:
        raise PamspecError.of("invalid_request", f"invalid settings: {variable}: a number of seconds above 0",
                              {"settings": [{"setting": variable, "error": "a number of seconds above 0"}]})
    return value
