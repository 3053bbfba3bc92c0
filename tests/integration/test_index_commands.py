"""The writer's two index commands: registering an Embedding Space and recording index entries.

Why: a space's registration is a ledger entry and compatibility is never inferred, so the same id must
never come to mean two descriptors; the indexer's `embedding_generated` / `index_rebuilt` entries are
event-only (no Memory Version) and written once however often the indexer resends them.
"""

from __future__ import annotations

from typing import Any

import msgspec
import psycopg
import pytest

from embedding.embedders import hashing_space
from infra.requester import CommandRequester
from pamledger.runtime import connect_nats
from schemas.common import SYSTEM_SCOPE
from schemas.errors import PamledgerError
from tests.conftest import ACTOR, Env

SERVICE_ACTOR = {"actor_id": "service:pamledger-indexer", "actor_kind": "service"}


@pytest.fixture(scope="module")
async def writer(service: Env) -> Any:
    nc = await connect_nats(service.nats_url, "test-index-commands")
    yield CommandRequester(nc, service.settings.subject_prefix, retries=0)
    await nc.close()


async def ledger(env: Env) -> list[tuple[int, str, str, bytes]]:
    async with await psycopg.AsyncConnection.connect(env.database_url, autocommit=True) as conn:
        cur = await conn.execute("SELECT ledger_sequence, scope_id, event_type, event FROM ledger ORDER BY 1")
        return [(r[0], r[1], r[2], bytes(r[3])) for r in await cur.fetchall()]


async def test_a_space_registers_once_and_a_changed_descriptor_under_its_id_is_refused(
        service: Env, writer: CommandRequester) -> None:
    space = msgspec.to_builtins(hashing_space(64))
    first = await writer.command("register_embedding_space",
                                 {"scope_id": SYSTEM_SCOPE, "space": space, "actor": SERVICE_ACTOR})
    # Another actor sending the same descriptor replays the first registration: the descriptor is the request.
    again = await writer.command("register_embedding_space",
                                 {"scope_id": SYSTEM_SCOPE, "space": space, "actor": ACTOR})
    assert again["ledger_sequence"] == first["ledger_sequence"]
    assert again["idempotency_result"] == "replayed_original_result"
    rows = await ledger(service)
    entry = msgspec.json.decode(rows[-1][3])
    assert (rows[-1][1], rows[-1][2]) == (SYSTEM_SCOPE, "index_rebuilt")
    assert entry["payload"]["action"] == "space_registered"
    assert entry["payload"]["embedding_space"] == space
    assert "version_id" not in entry

    changed = dict(space, model_revision="another")
    with pytest.raises(PamledgerError) as refused:
        await writer.command("register_embedding_space",
                             {"scope_id": SYSTEM_SCOPE, "space": changed, "actor": SERVICE_ACTOR})
    assert refused.value.code == "invalid_request"
    assert refused.value.details["embedding_space_id"] == space["embedding_space_id"]
    assert await ledger(service) == rows


@pytest.mark.parametrize("body, code", [
    ({"scope_id": "workspace:elsewhere"}, "invalid_request"),  # only the system scope holds registrations
    ({"space": {"embedding_space_id": "space:x:1"}}, "invalid_request"),  # a descriptor lacking fields
    ({"space": dict(msgspec.to_builtins(hashing_space(8)), dimensions=0)}, "invalid_request"),
    # More than an HNSW index holds: refused here, or the indexer would stop at the entry for good.
    ({"space": dict(msgspec.to_builtins(hashing_space(8)), dimensions=2001)}, "invalid_request"),
    ({"space": dict(msgspec.to_builtins(hashing_space(8)), colour="red")}, "invalid_request"),
    ({"idempotency_key": "mine"}, "invalid_request"),  # the key is the space id, never the caller's
])
async def test_bad_registrations_write_nothing(service: Env, writer: CommandRequester, body: dict[str, Any],
                                               code: str) -> None:
    await writer.command("create_scope", {"scope_id": "workspace:elsewhere", "scope_kind": "workspace"})
    before = await ledger(service)
    request = {"scope_id": SYSTEM_SCOPE, "space": msgspec.to_builtins(hashing_space(8)), "actor": SERVICE_ACTOR}
    with pytest.raises(PamledgerError) as refused:
        await writer.command("register_embedding_space", {**request, **body})
    assert refused.value.code == code
    assert await ledger(service) == before


async def test_index_entries_are_event_only_and_written_once_per_key(service: Env,
                                                                     writer: CommandRequester) -> None:
    await writer.command("create_scope", {"scope_id": "workspace:indexed", "scope_kind": "workspace"})
    body = {"scope_id": "workspace:indexed", "event_type": "embedding_generated", "actor": SERVICE_ACTOR,
            "payload": {"embedding_space_id": "space:x:1", "space_digest": "sha256:00", "count": 2,
                        "items": [["mem:a", "ver:a"], ["mem:b", "ver:b"]], "from_ledger_sequence": 1,
                        "through_ledger_sequence": 2}, "idempotency_key": "emb:1"}
    first = await writer.command("record_index_event", body)
    second = await writer.command("record_index_event", body)
    assert second["ledger_sequence"] == first["ledger_sequence"]
    rows = await ledger(service)
    assert [r for r in rows if r[2] == "embedding_generated"] == [rows[-1]]
    entry = msgspec.json.decode(rows[-1][3])
    assert entry["payload"] == body["payload"] and entry["sequence"] == rows[-1][0]
    with pytest.raises(PamledgerError) as refused:
        await writer.command("record_index_event", dict(body, event_type="object_created", idempotency_key="emb:2"))
    assert refused.value.code == "invalid_request"
    with pytest.raises(PamledgerError) as refused:  # an entry its type does not describe (schemas.events)
        await writer.command("record_index_event", dict(body, payload={"embedding_space_id": "space:x:1", "count": 2},
                                                       idempotency_key="emb:3"))
    assert refused.value.code == "invalid_request" and "space_digest" in refused.value.message
    assert await ledger(service) == rows
