"""The kernel's command requester: what the gateway writes its ledger entries with, now that it has no SDK.

Why: services must not import the SDK, yet the gateway writes open/close entries through the writer; the
requester answers in the server's own error type so the gateway's one error mapping turns it into a reply.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import nats
import pytest
from nats.aio.client import Client as NATS

from infra.requester import CommandRequester
from schemas.errors import PamledgerError
from tests.conftest import ACTOR, PROVENANCE, Env


@pytest.fixture(scope="module")
async def nc(service: Env) -> AsyncIterator[NATS]:
    conn = await nats.connect(service.nats_url)
    yield conn
    await conn.close()


async def test_a_command_through_the_requester_is_written_and_answers_its_result(service: Env, nc: NATS) -> None:
    requester = CommandRequester(nc, service.settings.subject_prefix)
    result = await requester.command("create_scope", {"scope_id": "workspace:requester", "scope_kind": "workspace"})
    assert result == {"scope_id": "workspace:requester", "created": True}


async def test_a_refused_command_raises_the_server_side_error_with_the_writers_code(service: Env, nc: NATS) -> None:
    requester = CommandRequester(nc, service.settings.subject_prefix)
    with pytest.raises(PamledgerError) as refused:
        await requester.command("create", {"scope_id": "workspace:nowhere", "object_type": "claim",
                                           "canonical_content": {"n": 1}, "actor": ACTOR, "provenance": PROVENANCE})
    assert refused.value.code == "scope_not_found"


async def test_no_writer_is_service_unavailable_after_the_retries(service: Env, nc: NATS) -> None:
    requester = CommandRequester(nc, "pam_nobody_serves_this", timeout=0.5, retries=1)
    with pytest.raises(PamledgerError) as away:
        await requester.command("create_scope", {"scope_id": "workspace:away", "scope_kind": "workspace"})
    assert away.value.code == "service_unavailable" and away.value.retryable
