"""TLS is an option of the same NATS configuration: with auth.nats_tls_cert/key the server requires TLS, and
the roles, operator tools and the SDK verify it against auth.nats_tls_ca.

Skipped where `openssl` is missing (the certificate is made by it, self-signed for 127.0.0.1).
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from authz.bootstrap import read_token
from authz.nats_auth import config_path
from infra.settings import AuthSettings, Settings
from local_servers.nats_server import nats_info
from local_servers.launch import start_nats
from pamledger_client.connection import open_nats
from pamledger_client.errors import PamspecError
from pamledger.auth import prepare_credentials
from pamledger.nats_users import prepare_nats_config
from pamledger.runtime import connect_nats

pytestmark = pytest.mark.skipif(shutil.which("openssl") is None, reason="openssl is needed to make a certificate")


def _certificate(folder: Path) -> tuple[Path, Path]:
    cert, key = folder / "cert.pem", folder / "key.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(key), "-out", str(cert),
                    "-days", "1", "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1"],
                   check=True, capture_output=True, timeout=60)
    return cert, key


async def test_a_tls_configuration_is_required_and_verified(tmp_path: Path) -> None:
    cert, key = _certificate(tmp_path)
    state = tmp_path / "state"
    settings = Settings(state_dir=state, auth=AuthSettings(mode="enforce", nats_tls_cert=cert, nats_tls_key=key,
                                                           nats_tls_ca=cert))
    prepare_credentials(settings)
    prepare_nats_config(settings)
    assert '"tls"' in config_path(state).read_text()
    server = start_nats(state / "nats")
    try:
        admin = read_token(state / "admin.token")
        nc = await open_nats(server.url, 2.0, admin, cert)  # the SDK: its token's login, over verified TLS
        assert nc.connected_url is not None and nc.is_connected
        await nc.close()
        service = await connect_nats(server.url, "pamledger-test", settings)  # a role: the service login
        assert service.is_connected
        await service.close()
        with pytest.raises(PamspecError) as err:  # the system's CAs do not know a self-signed certificate
            await open_nats(server.url, 1.0, admin)
        assert err.value.code == "service_unavailable"
        info = nats_info(server.port)  # no plaintext client is served: the greeting demands TLS
        assert info is not None and info["tls_required"] is True
    finally:
        server.stop()
