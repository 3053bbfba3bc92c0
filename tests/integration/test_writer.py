"""The writer and read side end to end: real NATS, real Postgres, the SDK."""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

import msgspec
import psycopg
import pytest
from nats.js.errors import NotFoundError

from command_handler.verify import verify_ledger
from pamledger_client.client import MemoryClient, PamspecError
from tests.conftest import ACTOR, PROVENANCE, Env, running_service, wait_for

pytestmark = pytest.mark.profile("PAMSPEC-Lite", "PAMSPEC-Versioning", "PAMSPEC-Ledger")  # implementation-report.md

SCOPE = "workspace:writer"
OTHER = "workspace:other.scope.v1"


@pytest.fixture(scope="module", autouse=True)
async def scopes(client: MemoryClient) -> None:
    await client.create_scope(SCOPE)
    await client.create_scope(OTHER)


async def new_claim(client: MemoryClient, text: str = "the sky is blue", **extra: Any) -> dict[str, Any]:
    return await client.create(SCOPE, "claim", {"statement": text}, ACTOR, PROVENANCE, **extra)


async def error_code(call: Any) -> PamspecError:
    with pytest.raises(PamspecError) as err:
        await call
    return err.value


async def test_create_then_read_round_trips_the_committed_envelope(client: MemoryClient) -> None:
    created = await new_claim(client)
    read = await client.read(SCOPE, created["object_id"])
    assert read == created["envelope"]
    assert read["canonical_content"] == {"statement": "the sky is blue"}
    assert created["sequence"] == 1 and created["ledger_sequence"] >= 1


async def test_reads_of_a_committed_version_are_byte_identical(client: MemoryClient, service: Env) -> None:
    created = await new_claim(client)
    subject = f"{service.settings.subject_prefix}.query.read"
    body = msgspec.json.encode({"scope_id": SCOPE, "object_id": created["object_id"]})
    replies = [(await client.nc.request(subject, body, timeout=10)).data for _ in range(3)]
    assert replies[0] == replies[1] == replies[2]


async def test_an_object_in_another_scope_is_object_not_found(client: MemoryClient) -> None:
    created = await new_claim(client)
    err = await error_code(client.read(OTHER, created["object_id"]))
    missing = await error_code(client.read(OTHER, "mem:does-not-exist"))
    assert err.code == missing.code == "object_not_found"
    assert err.message == missing.message


async def test_an_unknown_scope_is_scope_not_found(client: MemoryClient) -> None:
    err = await error_code(client.create("workspace:nope", "claim", {}, ACTOR, PROVENANCE))
    assert err.code == "scope_not_found"


async def test_same_idempotency_key_and_request_returns_the_original_result(client: MemoryClient) -> None:
    key = f"k:{uuid.uuid4()}"
    first = await new_claim(client, idempotency_key=key)
    again = await new_claim(client, idempotency_key=key)
    assert (again["object_id"], again["version_id"], again["ledger_sequence"]) == (
        first["object_id"], first["version_id"], first["ledger_sequence"])
    err = await error_code(new_claim(client, "different", idempotency_key=key))
    assert err.code == "duplicate_operation" and not err.retryable


async def test_a_committed_write_whose_reply_fails_to_render_answers_what_is_known(
        client: MemoryClient, monkeypatch: pytest.MonkeyPatch) -> None:
    """A reply that cannot be rendered must not call a committed write failed: its ids and sequence come
    back (marked incomplete), and re-sending it with its idempotency key replays the full result."""
    import command_handler.writer

    def unrenderable(*args: Any) -> bytes:
        raise RuntimeError("rendering failed")

    key = f"k:{uuid.uuid4()}"
    monkeypatch.setattr(command_handler.writer, "result_bytes", unrenderable)
    known = await new_claim(client, "rendered later", idempotency_key=key)
    monkeypatch.undo()
    assert known["reply_incomplete"] is True and known["object_id"].startswith("mem:"), known
    assert known["version_id"].startswith("ver:") and known["event_id"].startswith("evt:")
    full = await new_claim(client, "rendered later", idempotency_key=key)
    assert (full["object_id"], full["version_id"], full["ledger_sequence"]) == (
        known["object_id"], known["version_id"], known["ledger_sequence"])
    assert full["envelope"]["canonical_content"] == {"statement": "rendered later"}


async def test_concurrent_duplicates_in_one_batch_commit_once(client: MemoryClient, service: Env) -> None:
    key = f"k:{uuid.uuid4()}"
    results = await asyncio.gather(*[new_claim(client, "burst", idempotency_key=key) for _ in range(20)])
    assert len({r["version_id"] for r in results}) == 1
    async with await psycopg.AsyncConnection.connect(service.database_url) as conn:
        cur = await conn.execute("SELECT count(*) FROM idempotency_records WHERE idempotency_key = %s", (key,))
        assert (await cur.fetchone()) == (1,)


async def test_an_event_only_entry_with_a_known_key_is_written_once(client: MemoryClient, service: Env) -> None:
    """A close finished twice (say, again after a gateway crash) must not leave two subscription_closed."""
    subscription_id = f"sub:{uuid.uuid4()}"
    body = {"scope_id": SCOPE, "subscription_id": subscription_id, "actor": ACTOR, "reason": "client_closed",
            "last_delivered_sequence": 0, "idempotency_key": f"gateway:close:{subscription_id}"}
    burst = await asyncio.gather(*[client.command("close_subscription", body) for _ in range(5)])
    again = await client.command("close_subscription", body)
    entries = {(r["ledger_sequence"], r["event_id"]) for r in [*burst, again]}
    assert len(entries) == 1
    assert again["idempotency_result"] == "replayed_original_result"
    err = await error_code(client.command("close_subscription", {**body, "reason": "something else"}))
    assert err.code == "duplicate_operation"
    async with await psycopg.AsyncConnection.connect(service.database_url) as conn:
        cur = await conn.execute("SELECT count(*) FROM ledger WHERE event_type = 'subscription_closed'"
                                 " AND convert_from(event, 'UTF8')::jsonb -> 'payload' ->> 'subscription_id' = %s",
                                 (subscription_id,))
        assert (await cur.fetchone()) == (1,)


async def test_update_transition_delete_and_history(client: MemoryClient, service: Env) -> None:
    created = await new_claim(client, "secret words")
    oid = created["object_id"]
    updated = await client.update(SCOPE, oid, created["version_id"], {"statement": "more secret"}, ACTOR, PROVENANCE)
    moved = await client.transition(SCOPE, oid, updated["version_id"], "validation", "corroborated", ACTOR, PROVENANCE)
    assert moved["envelope"]["validation_state"] == "corroborated"
    assert moved["envelope"]["canonical_content"] == {"statement": "more secret"}
    stale = await error_code(client.update(SCOPE, oid, created["version_id"], {}, ACTOR, PROVENANCE))
    assert stale.code == "version_conflict" and stale.details["current_version_id"] == moved["version_id"]
    deleted = await client.delete(SCOPE, oid, moved["version_id"], ACTOR, PROVENANCE)
    assert deleted["envelope"]["availability_state"] == "deleted"
    for version in (None, created["version_id"], updated["version_id"]):
        assert (await error_code(client.read(SCOPE, oid, version))).code == "object_deleted"
    tomb = await client.read(SCOPE, oid, deleted["version_id"])
    assert tomb["canonical_content"] == {"tombstone": True}
    later = await error_code(client.update(SCOPE, oid, deleted["version_id"], {}, ACTOR, PROVENANCE))
    assert later.code == "object_deleted"
    history = await client.history(SCOPE, oid)
    assert [v["sequence"] for v in history["versions"]] == [1, 2, 3, 4]
    assert all(v["canonical_content"] is None for v in history["versions"][:3])
    assert [e["event"]["event_type"] for e in history["events"]] == [
        "object_created", "object_updated", "validation_transitioned", "object_deleted"]
    async with await psycopg.AsyncConnection.connect(service.database_url) as conn:
        cur = await conn.execute("SELECT count(*) FROM content_store WHERE object_id = %s", (oid,))
        assert (await cur.fetchone()) == (0,)
        cur = await conn.execute("SELECT count(*) FROM ledger WHERE position('secret' in convert_from(event, 'UTF8')) > 0")
        assert (await cur.fetchone()) == (0,)


async def test_legal_hold_blocks_delete(client: MemoryClient) -> None:
    created = await new_claim(client)
    held = await client.transition(SCOPE, created["object_id"], created["version_id"], "retention", "legal_hold",
                                   ACTOR, PROVENANCE)
    err = await error_code(client.delete(SCOPE, created["object_id"], held["version_id"], ACTOR, PROVENANCE))
    assert err.code == "legal_hold"
    assert (await client.read(SCOPE, created["object_id"]))["retention_state"] == "legal_hold"


async def test_the_ledger_refuses_update_delete_and_truncate(service: Env) -> None:
    async with await psycopg.AsyncConnection.connect(service.database_url, autocommit=True) as conn:
        for sql in ("UPDATE ledger SET event_type = 'x'", "DELETE FROM ledger", "TRUNCATE ledger",
                    "UPDATE memory_versions SET meta = ''::bytea", "DELETE FROM memory_versions"):
            with pytest.raises(psycopg.errors.InsufficientPrivilege):
                await conn.execute(sql)


async def test_group_commit_keeps_the_ledger_gapless_and_verifiable(client: MemoryClient, service: Env) -> None:
    await asyncio.gather(*[new_claim(client, f"claim {i}") for i in range(300)])
    async with await psycopg.AsyncConnection.connect(service.database_url) as conn:
        cur = await conn.execute("SELECT count(*), min(ledger_sequence), max(ledger_sequence),"
                                 " count(DISTINCT event_id) FROM ledger")
        count, low, high, distinct = await cur.fetchone()  # type: ignore[misc]
    assert (low, high, distinct) == (1, count, count)
    assert (await verify_ledger(service.database_url, service.nats_url, service.settings.stream_name))["ok"]


async def test_the_stream_equals_the_ledger(client: MemoryClient, service: Env) -> None:
    await new_claim(client)
    await assert_stream_equals_ledger(client.nc, service)


async def assert_stream_equals_ledger(nc: Any, env: Env) -> None:
    """The stream holds exactly the ledger's rows. The ledger is read afresh on each try: other writers
    (the indexer's entries) may append meanwhile, and the stream must then catch up with those too."""
    js = nc.jetstream()
    rows: list[Any] = []

    async def caught_up() -> bool:
        nonlocal rows
        async with await psycopg.AsyncConnection.connect(env.database_url) as conn:
            cur = await conn.execute("SELECT ledger_sequence, event_id, event FROM ledger ORDER BY ledger_sequence")
            rows = await cur.fetchall()
        try:
            info = await js.stream_info(env.settings.stream_name)
        except NotFoundError:  # being rebuilt
            return False
        return bool(info.state.last_seq == len(rows))

    await wait_for(caught_up, timeout=30, interval=0.2)
    for seq, event_id, event in rows:
        msg = await js.get_msg(env.settings.stream_name, seq)
        assert msg.headers["Nats-Msg-Id"] == event_id
        assert msg.data == bytes(event)


async def test_idempotency_survives_a_writer_restart(servers: Any) -> None:
    from tests.conftest import fresh_database, fresh_settings

    env = Env(servers, fresh_database(servers, "restart"), fresh_settings("restart"))
    key = f"k:{uuid.uuid4()}"
    results = []
    for _ in range(2):  # two service lifetimes: the second starts with empty caches
        async with running_service(env):
            client = await MemoryClient.connect(env.nats_url, env.settings.subject_prefix)
            await client.create_scope(SCOPE)
            results.append(await new_claim(client, "durable", idempotency_key=key))
            await client.close()
    assert results[1]["version_id"] == results[0]["version_id"]
    assert results[1]["idempotency_result"] == "replayed_original_result"
    assert results[1]["envelope"] == results[0]["envelope"]


async def test_a_retried_update_replays_after_a_writer_restart(servers: Any) -> None:
    """The retry's expected version is stale once its first try committed: a new writer (empty caches) must
    look its key up rather than answer version_conflict."""
    from tests.conftest import fresh_database, fresh_settings

    env = Env(servers, fresh_database(servers, "retry_update"), fresh_settings("retry_update"))
    key = f"k:{uuid.uuid4()}"
    results = []
    async with running_service(env):
        client = await MemoryClient.connect(env.nats_url, env.settings.subject_prefix)
        await client.create_scope(SCOPE)
        made = await new_claim(client, "first")
        await client.close()
    for _ in range(2):  # the first try, then its retry in a second service lifetime
        async with running_service(env):
            client = await MemoryClient.connect(env.nats_url, env.settings.subject_prefix)
            results.append(await client.update(SCOPE, made["object_id"], made["version_id"], {"statement": "second"},
                                               ACTOR, PROVENANCE, idempotency_key=key))
            await client.close()
    assert results[1]["version_id"] == results[0]["version_id"]
    assert results[1]["idempotency_result"] == "replayed_original_result"


async def test_a_tampered_row_is_named_by_verify(servers: Any) -> None:
    from tests.conftest import fresh_database, fresh_settings

    env = Env(servers, fresh_database(servers, "tamper"), fresh_settings("tamper"))
    async with running_service(env):
        client = await MemoryClient.connect(env.nats_url, env.settings.subject_prefix)
        await client.create_scope("workspace:t")
        for i in range(5):
            await client.create("workspace:t", "claim", {"n": i}, ACTOR, PROVENANCE)
        await client.close()
    verified = await verify_ledger(env.database_url, env.nats_url, env.settings.stream_name)
    assert verified == {**verified, "ok": True, "rows_checked": 5}
    async with await psycopg.AsyncConnection.connect(env.database_url, autocommit=True) as conn:
        await conn.execute("ALTER TABLE ledger DISABLE TRIGGER ledger_append_only")
        await conn.execute("UPDATE ledger SET event = convert_to(replace(convert_from(event, 'UTF8'),"
                           " 'claim', 'CLAIM'), 'UTF8') WHERE ledger_sequence = 3")
    result = await verify_ledger(env.database_url, env.nats_url, env.settings.stream_name)
    assert not result["ok"] and result["first_bad_sequence"] == 3


async def test_a_command_postgres_refuses_fails_alone_and_its_batch_mates_commit(servers: Any) -> None:
    """A database error caused by one command's rows must not fail the others that shared its group commit:
    the writer retries the batch one command at a time. A trigger plays the command Postgres refuses."""
    from tests.conftest import fresh_database, fresh_settings

    env = Env(servers, fresh_database(servers, "poison"), fresh_settings("poison"))
    async with await psycopg.AsyncConnection.connect(env.database_url, autocommit=True) as conn:
        await conn.execute(
            "CREATE FUNCTION refuse_poison() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN"
            " IF NEW.scope_id = 'workspace:poison' THEN RAISE EXCEPTION 'poisoned row'; END IF;"
            " RETURN NEW; END $$")
        await conn.execute("CREATE TRIGGER refuse_poison BEFORE INSERT ON ledger FOR EACH ROW"
                           " EXECUTE FUNCTION refuse_poison()")
    async with running_service(env):
        client = await MemoryClient.connect(env.nats_url, env.settings.subject_prefix)
        client.retries = 0
        for scope in (SCOPE, "workspace:poison"):
            await client.create_scope(scope)
        outcomes = await asyncio.gather(*(
            client.create(SCOPE if i % 2 else "workspace:poison", "claim", {"n": i}, ACTOR, PROVENANCE)
            for i in range(40)), return_exceptions=True)
        good = [o for i, o in enumerate(outcomes) if i % 2]
        bad = [o for i, o in enumerate(outcomes) if not i % 2]
        assert all(isinstance(o, dict) and o["ledger_sequence"] > 0 for o in good)
        assert all(isinstance(o, PamspecError) and o.code == "internal_error" for o in bad)
        sequences = sorted(o["ledger_sequence"] for o in good)  # type: ignore[index]
        assert sequences == list(range(1, 21)), "a refused command must not leave a gap"
        assert (await client.status("writer"))["ledger_sequence"] == 20
        await client.close()
    assert (await verify_ledger(env.database_url, env.nats_url, env.settings.stream_name))["ok"]
