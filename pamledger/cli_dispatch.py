"""How the `pamledger` command line runs one command: settings read, logging set up, every failure as the
PAMSPEC error envelope; client commands get the client's configuration made from the same settings.

Why apart from pamledger.cli: the bundle and conformance commands (pamledger.cli_bundle, pamledger.conformance)
call the SDK with the configuration the settings give, and the CLI's parser module imports them.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
from collections.abc import Callable

from infra.logging import configure_logging
from infra.settings import Settings
from pamledger.cli_errors import failed
from pamledger_client.cli import ClientHandler
from pamledger_client.cli_common import emit_error
from pamledger_client.config import ClientConfig

Handler = Callable[[Settings, argparse.Namespace], int]


def client_config(settings: Settings) -> ClientConfig:
    """What the SDK needs of the settings (the same PAMLEDGER_* values the client alone would read)."""
    return ClientConfig(nats_url=settings.nats_url, token=settings.token, state_dir=settings.state_dir,
                        subject_prefix=settings.subject_prefix,
                        request_timeout_seconds=settings.request_timeout_seconds,
                        nats_tls_ca=settings.auth.nats_tls_ca, admin_token_file=settings.auth.admin_token_file)


def server_handler(handler: ClientHandler) -> Handler:
    """A client command run by the server's CLI: the client's configuration from the settings."""
    def run(settings: Settings, args: argparse.Namespace) -> int:
        return handler(client_config(settings), args)
    return run


def dispatch(handler: Handler, args: argparse.Namespace, serving: bool = False) -> int:
    """Run one command; whatever it raises (settings, NATS, Postgres, local servers, a bug) ends as the error
    envelope on stderr with a non-zero exit (pamledger.cli_errors). Usage errors exit 2 from the parser.
    `serving` (run, serve): an unexpected failure is logged as the service's crash record at any level."""
    settings: Settings | None = None
    try:
        settings = Settings()
        configure_logging(settings.log_format, settings.log_level)
        return handler(settings, args)
    except BrokenPipeError:
        # The reader of our output went away (`| head`): the command itself ran (a write committed), so say
        # nothing more and exit as a process killed by SIGPIPE would, like other Unix tools.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 128 + signal.SIGPIPE
    except Exception as exc:  # noqa: BLE001 - every failure becomes the envelope (cli_errors.as_pamspec)
        state_dir = str(settings.state_dir) if settings is not None else None
        return emit_error(failed(exc, state_dir, settings is not None, serving=serving))
