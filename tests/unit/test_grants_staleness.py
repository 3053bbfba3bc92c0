"""A grants snapshot this process cannot refresh is trusted for a short while only: then the policy fails closed
(a revocation may have committed where this process cannot see it)."""

from __future__ import annotations

import time

import pytest

from authz.enforce import TokenPolicy
from authz.registry import STALE_AFTER_REFRESHES, GrantsRegistry
from infra.request_shell import context_of
from schemas.errors import ServiceUnavailable


def test_a_snapshot_not_refreshed_for_long_fails_closed() -> None:
    registry = GrantsRegistry("postgresql://unused", [], refresh_seconds=0.5)
    policy = TokenPolicy(registry)
    context = context_of("pamledger.query.read", {"Authorization": "Bearer pam_0123456789abcdef_x"})
    assert not registry.stale()  # never loaded: "not loaded yet" is answered elsewhere
    registry.loaded.set()
    registry.refreshed_at = time.monotonic()
    assert not registry.stale()
    policy.decide(context, "query.read")  # decided (a denial: the token is unknown), not refused as stale
    registry.refreshed_at = time.monotonic() - STALE_AFTER_REFRESHES * 0.5 - 1
    assert registry.stale()
    with pytest.raises(ServiceUnavailable):
        policy.decide(context, "query.read")
