"""Wiring authorization into the roles of one process: the policy, the grants snapshot that feeds it, the
service's own credential, the denial audit and Subscribe's per-event check (docs/security.md)."""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from nats.aio.client import Client as NATS

from authz.audit import DenialLimiter, DenialRecorder
from authz.bootstrap import admin_token_path, bootstrap_credentials, ensure_token, service_token_path
from authz.enforce import GrantsAuthorizer, RecordedDenials, TokenPolicy
from authz.registry import GrantsRegistry
from authz.exercise import DelegatedReads
from infra.request_shell import AllowAll, DelegationGate, DenialSink, Policy
from infra.requester import CommandRequester
from infra.settings import Settings
from subscriptions.filters import Authorizer, SameScope


@dataclass
class Auth:
    policy: Policy
    authorizer: Authorizer
    service_token: str | None = None
    registry: GrantsRegistry | None = None
    limiter: DenialLimiter | None = None

    def denials(self, nc: NATS, prefix: str) -> DenialSink | None:
        """Where the query service and the gateway record their denials (None where auth is off)."""
        if self.limiter is None:
            return None
        requester = CommandRequester(nc, prefix, timeout=2.0, retries=1, token=self.service_token)
        return RecordedDenials(DenialRecorder(requester, self.limiter))


def delegated_reads(auth: Auth, nc: NATS, prefix: str) -> DelegationGate | None:
    """Where the query service has reads under a delegation exercised (None where auth is off)."""
    if auth.limiter is None:
        return None
    return DelegatedReads(CommandRequester(nc, prefix, timeout=5.0, retries=1, token=auth.service_token))


def auth_for(settings: Settings, database_url: str) -> Auth:
    """Auth as the settings say: enforced (the tokens made in the state dir when absent) or off."""
    if settings.auth.mode == "off":
        return Auth(AllowAll(), SameScope())
    admin, _ = ensure_token(admin_token_path(settings))
    service, _ = ensure_token(service_token_path(settings))
    registry = GrantsRegistry(database_url, bootstrap_credentials(admin, service), settings.auth.refresh_seconds)
    limiter = DenialLimiter(settings.auth.denial_burst, settings.auth.denial_every_seconds)
    return Auth(TokenPolicy(registry), GrantsAuthorizer(registry), service, registry, limiter)


def prepare_credentials(settings: Settings) -> dict[str, Any]:
    """Make the administrative and the service token when absent (auth enforced) and say where they are.

    The administrative token itself is never part of what this returns (it goes into JSON lines, and so into
    captured logs): when it is made, it is shown once on the terminal, as a plain line, and only there."""
    if settings.auth.mode == "off":
        return {"auth": "off"}
    admin_path = admin_token_path(settings)
    admin, made = ensure_token(admin_path)
    ensure_token(service_token_path(settings))
    if made:
        show_on_terminal(admin, admin_path)
    return {"auth": "enforce", "admin_token_file": str(admin_path), "admin_token_made": made}


def show_on_terminal(token: str, path: Path) -> bool:
    """Print a new administrative token once where a person sees it (a terminal on stderr); never into a
    file or a pipe. Returns whether it was shown."""
    if not sys.stderr.isatty():
        return False
    print(f"pamledger: a new administrative token (shown once; kept in {path}, mode 0600):\n  {token}",
          file=sys.stderr, flush=True)
    return True
