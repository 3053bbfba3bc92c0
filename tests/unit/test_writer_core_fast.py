"""Given a store, when batches of commands go through plan_batch and the store's append one after another,
then the replies and the store's state: the writer's core end to end, in microseconds, with no I/O.

Why: test_plan_batch checks one batch against state built by hand; here each batch is decided against what
the previous ones left in an InMemoryLedgerStore (held to Postgres's behaviour by tests/ledger_store_contract.py),
read through the LedgerStore port the way the writer's shell reads it, caches and optimistic idempotency
included. A new Shell on the same store is a writer that has just taken over (empty caches).
"""

from __future__ import annotations

from typing import Any

import msgspec
import pytest

from command_handler.core.chain import GENESIS_HASH
from command_handler.core.intake import Parsed
from command_handler.memory_store import IDEMPOTENCY_KEY, InMemoryLedgerStore, StoreRefused
from command_handler.core.planner import Outcome, PlanInputs, plan_batch, refused_before_key_check
from command_handler.core.redactions import minimum_retention_days
from command_handler.core.references import delegation_named, erases_content, head_keys
from command_handler.core.state import ObjectHead
from command_handler.core.batch import LedgerStore, forgotten
from infra.ledger import IdempotencyRow
from schemas.commands import CorrectProvenance, CreateScope, TransitionState
from schemas.errors import InvalidRequest, PamledgerError
from schemas.redaction import Redact
from schemas.registry import default_registry
from schemas.replies import entry_result_bytes, error_reply, result_bytes
from tests.ledger_store_contract import (
    OTHER, PROV, SCOPE, Stamps, check, command, create, delete, redact, scope, transition, update)

REGISTRY = default_registry()
CONTENT_READERS = (TransitionState, Redact, CorrectProvenance)  # commands whose reply or decision reads content
Item = Parsed | PamledgerError


class Shell:
    """The writer's batch path (command_handler.writer: _load, _plan_and_append, _advance) without NATS: its
    caches as plain dicts, every read through the LedgerStore port; `refused_keys` counts the appends the
    store refused for an idempotency key seen before (the writer then plans again with the records)."""

    def __init__(self, store: LedgerStore, stamps: Stamps | None = None) -> None:
        self.store = store
        self.stamps = stamps or Stamps()
        self.heads: dict[tuple[str, str], ObjectHead] = {}
        self.idempotency: dict[tuple[str, str], IdempotencyRow] = {}
        self.scopes: set[str] = set()
        self.policies: dict[str, Any] = {}
        self.tail = (0, GENESIS_HASH)
        self.refused_keys = 0

    async def send(self, *items: Item) -> list[dict[str, Any]]:
        """One group commit of these commands; their replies, in order."""
        self.tail = await self.store.tail()
        parsed = [item for item in items if isinstance(item, Parsed)]
        plan = plan_batch(list(items), await self._load(parsed, with_idempotency=False))
        if refused_before_key_check(list(items), plan, self.idempotency.__contains__):
            plan = plan_batch(list(items), await self._load(parsed, with_idempotency=True))
        if plan.batch.ledger or plan.batch.scopes:
            try:
                await self.store.append(plan.batch)
            except StoreRefused as exc:
                if exc.constraint != IDEMPOTENCY_KEY:
                    raise
                self.refused_keys += 1
                plan = plan_batch(list(items), await self._load(parsed, with_idempotency=True))
                if plan.batch.ledger or plan.batch.scopes:
                    await self.store.append(plan.batch)
        self.heads.update(plan.heads)
        self.idempotency.update(plan.idempotency)
        if plan.batch.erase:
            self.idempotency.clear()
        self.scopes |= plan.new_scopes
        return [reply(outcome) for outcome in plan.outcomes]

    async def _load(self, parsed: list[Parsed], with_idempotency: bool) -> PlanInputs:
        """What writer._load reads: the caches first, the store for what they lack."""
        commands = [p for p in parsed if not isinstance(p.command, CreateScope)]
        keys = [(p.scope_id, p.idempotency_key) for p in commands if p.idempotency_key]
        store = self.store
        self.scopes |= await store.known_scopes(sorted({p.scope_id for p in parsed} - self.scopes))
        named = {k for p in commands for k in head_keys(p.command)}
        self.heads.update(await store.load_heads(sorted(named - set(self.heads))))
        if with_idempotency:
            self.idempotency.update(await store.load_idempotency(sorted(set(keys) - set(self.idempotency))))
        heads = {k: self.heads[k] for k in named if k in self.heads}
        restorable = await store.load_restorable(sorted(
            (p.scope_id, p.command.object_id) for p in commands if isinstance(p.command, TransitionState)
            and (p.command.dimension, p.command.target_state) == ("availability", "available")))
        digests = [h.content_digest for p in commands if isinstance(p.command, CONTENT_READERS)
                   for h in [heads.get((p.scope_id, p.command.object_id))] if h and h.content_digest]
        erasing = [p for p in commands if erases_content(p.command)]
        unread = {p.scope_id for p in erasing} - set(self.policies)
        self.policies.update(await store.load_scope_policies(sorted(unread)))
        policies = {p.scope_id: self.policies.get(p.scope_id) for p in erasing}
        retained = {(p.scope_id, str(getattr(p.command, "object_id"))) for p in erasing
                    if minimum_retention_days(policies.get(p.scope_id)) is not None}
        delegations = {d for p in commands for d in [delegation_named(p.command)] if d}
        return PlanInputs(
            heads=heads, scope_known=self.scopes.__contains__, stamp=self.stamps, tail=self.tail, registry=REGISTRY,
            idempotency={key: self.idempotency[key] for key in keys if key in self.idempotency},
            contents=await store.load_contents(digests + list(restorable.values())), restorable=restorable,
            scope_policies=policies, created_at=await store.load_created_at(sorted(retained)),
            delegations=await store.load_delegations(sorted(delegations)))


def reply(outcome: Outcome) -> dict[str, Any]:
    """What the writer answers (writer._render), decoded; a replay is shown by the record it replays (its
    envelope is read from Postgres)."""
    if outcome.accepted is not None:
        a = outcome.accepted
        if a.decision.head is None:
            entry = msgspec.json.decode(entry_result_bytes(a.ledger_sequence, a.decision.event.event_id))
            return {"result": {**entry["result"], **(a.decision.result or {})}}
        body = result_bytes(a.decision.head, a.ledger_sequence, a.decision.event.event_id, a.content, a.decision.result)
        return msgspec.json.decode(body)  # type: ignore[no-any-return]
    if outcome.error is not None:
        return msgspec.json.decode(error_reply(outcome.error, "op:reply"))  # type: ignore[no-any-return]
    if outcome.scope_result is not None:
        return {"result": outcome.scope_result}
    if outcome.same_as is not None:
        return {"same_as": outcome.same_as}
    assert outcome.replay_of is not None
    return {"replay_of": outcome.replay_of}


def result(answer: dict[str, Any]) -> dict[str, Any]:
    assert "result" in answer, answer
    return answer["result"]  # type: ignore[no-any-return]


def code(answer: dict[str, Any]) -> str:
    assert "error" in answer, answer
    return answer["error"]["code"]  # type: ignore[no-any-return]


def minted(key: str | None = None, text: str = "x") -> Parsed:
    """A create whose object id the writer mints."""
    return command("create", key, object_type="claim", canonical_content={"statement": text}, provenance=PROV)


async def started(*scopes: Parsed) -> tuple[InMemoryLedgerStore, Shell]:
    store = InMemoryLedgerStore()
    shell = Shell(store)
    await shell.send(*(scopes or (scope(SCOPE),)))
    return store, shell


async def test_create_update_and_transition_move_the_head_batch_after_batch() -> None:
    store, shell = await started()
    [made] = await shell.send(create("mem:a", text="one"))
    [moved] = await shell.send(update("mem:a", result(made)["version_id"], "two"))
    [judged] = await shell.send(transition("mem:a", result(moved)["version_id"]))
    assert [result(r)["ledger_sequence"] for r in (made, moved, judged)] == [1, 2, 3]
    assert [result(r)["sequence"] for r in (made, moved, judged)] == [1, 2, 3]
    assert result(judged)["envelope"]["canonical_content"] == {"statement": "two"}  # carried from the store
    assert result(judged)["envelope"]["validation_state"] == "corroborated"
    head = (await store.load_heads([(SCOPE, "mem:a")]))[(SCOPE, "mem:a")]
    assert (head.version_id, head.sequence) == (result(judged)["version_id"], 3)
    assert head.content_digest is not None
    assert await store.load_contents([head.content_digest]) == {head.content_digest: b'{"statement":"two"}'}
    assert [r.event_type for r in store.ledger.values()] == [
        "object_created", "object_updated", "validation_transitioned"]
    assert await store.broken_tail(10) is None


async def test_a_stale_expected_version_is_a_version_conflict_and_writes_nothing() -> None:
    store, shell = await started()
    [made] = await shell.send(create("mem:a"))
    first = result(made)["version_id"]
    await shell.send(update("mem:a", first, "two"))
    tail = await store.tail()
    [stale] = await shell.send(update("mem:a", first, "three"))
    assert code(stale) == "version_conflict"
    head = (await store.load_heads([(SCOPE, "mem:a")]))[(SCOPE, "mem:a")]
    assert stale["error"]["details"]["current_version_id"] == head.version_id
    assert await store.tail() == tail


async def test_a_stale_expectation_seen_by_a_new_writer_is_a_version_conflict_too() -> None:
    """The head comes from the store, not from a cache: a writer that took over decides alike."""
    store, shell = await started()
    [made] = await shell.send(create("mem:a"))
    await shell.send(update("mem:a", result(made)["version_id"], "two"))
    [stale] = await Shell(store, shell.stamps).send(update("mem:a", result(made)["version_id"], "three"))
    assert code(stale) == "version_conflict"


async def test_a_command_in_an_unknown_scope_is_scope_not_found_and_its_mates_commit() -> None:
    store, shell = await started()
    replies = await shell.send(create("mem:a", scope_id="workspace:nope"), create("mem:b"),
                               InvalidRequest("malformed create command"), update("mem:gone", "ver:0", "y"))
    assert [r.get("error", {}).get("code") for r in replies] == [
        "scope_not_found", None, "invalid_request", "object_not_found"]
    assert set(await store.load_heads([("workspace:nope", "mem:a"), (SCOPE, "mem:b")])) == {(SCOPE, "mem:b")}
    assert await store.tail() == (1, store.ledger[1].row_hash)


async def test_a_scope_created_twice_is_created_once_and_its_retention_policy_guards_erasure() -> None:
    store, shell = await started(scope(SCOPE), scope(OTHER, {"retention": {"minimum_days": 30}}))
    again = await shell.send(scope(OTHER, {"retention": {"minimum_days": 0}}))
    assert again == [{"result": {"scope_id": OTHER, "created": False}}]
    assert await store.load_scope_policies([OTHER]) == {OTHER: {"retention": {"minimum_days": 30}}}
    [made] = await shell.send(create("mem:a", scope_id=OTHER))
    erase = command("delete", scope_id=OTHER, object_id="mem:a", expected_version_id=result(made)["version_id"],
                    provenance=PROV)
    [refused] = await shell.send(erase)
    assert code(refused) == "retention_restriction"  # created seconds ago (load_created_at), kept 30 days
    head = (await store.load_heads([(OTHER, "mem:a")]))[(OTHER, "mem:a")]
    assert head.version_id == result(made)["version_id"] and head.content_digest is not None
    assert list(await store.load_contents([head.content_digest])) == [head.content_digest]


async def test_a_delete_erases_every_version_and_later_commands_meet_the_tombstone() -> None:
    store, shell = await started()
    [made] = await shell.send(create("mem:a", text="one"))
    moved, _ = await shell.send(update("mem:a", result(made)["version_id"], "two"), create("mem:b", text="kept"))
    [gone] = await shell.send(delete("mem:a", result(moved)["version_id"]))
    assert result(gone)["envelope"]["availability_state"] == "deleted"
    assert [c.object_id for c in store.content.values()] == ["mem:b"]
    after = await shell.send(update("mem:a", result(gone)["version_id"], "three"),
                             transition("mem:a", result(gone)["version_id"]),
                             delete("mem:a", result(gone)["version_id"]))
    assert [code(r) for r in after] == ["object_deleted"] * 3
    assert (await store.tail())[0] == 4


async def test_an_erasing_redaction_cannot_be_restored_and_a_suppressing_one_can() -> None:
    store, shell = await started()
    made = await shell.send(create("mem:a", text="erase me"), create("mem:b", text="hide me"))
    erased, hidden = await shell.send(redact("mem:a", result(made[0])["version_id"], erase=True),
                                      redact("mem:b", result(made[1])["version_id"], erase=False))
    assert {result(r)["envelope"]["availability_state"] for r in (erased, hidden)} == {"redacted"}
    assert [c.object_id for c in store.content.values()] == ["mem:b"]  # suppressed content stays stored
    restore = [transition(o, result(r)["version_id"], "available", "availability", policy_basis="restoration: test")
               for o, r in (("mem:a", erased), ("mem:b", hidden))]
    nothing, back = await shell.send(*restore)
    assert code(nothing) == "invalid_state_transition"
    assert result(back)["envelope"]["canonical_content"] == {"statement": "hide me"}
    [refused] = await shell.send(update("mem:a", result(erased)["version_id"], "again"))
    assert code(refused) == "object_redacted"


async def test_a_partial_redaction_keeps_the_projection_and_blocks_updates() -> None:
    store, shell = await started()
    [made] = await shell.send(create("mem:a", text="s", secret="p"))
    [partial] = await shell.send(redact("mem:a", result(made)["version_id"], ["/secret"]))
    assert result(partial)["envelope"]["canonical_content"] == {"secret": "[REDACTED]", "statement": "s"}
    assert [c.content for c in store.content.values()] == [b'{"secret":"[REDACTED]","statement":"s"}']
    [refused] = await shell.send(update("mem:a", result(partial)["version_id"], "t"))
    assert code(refused) == "object_redacted"


async def test_a_retried_create_replays_its_record_in_the_same_writer_and_after_a_takeover() -> None:
    store, shell = await started()
    [made] = await shell.send(minted("k:1"))
    rows = len(store.ledger)
    [same] = await shell.send(minted("k:1"))  # the writer's cache holds the record
    [taken_over] = await Shell(store, shell.stamps).send(minted("k:1"))  # the store refuses the key first
    record = (await store.load_idempotency([(SCOPE, "k:1")]))[(SCOPE, "k:1")]
    assert same == taken_over == {"replay_of": record}
    assert (record.object_id, record.version_id) == (result(made)["object_id"], result(made)["version_id"])
    assert len(store.ledger) == rows


async def test_a_refused_key_is_planned_again_with_its_record_and_the_batch_mates_commit() -> None:
    store, shell = await started()
    await shell.send(minted("k:1"))
    fresh = Shell(store, shell.stamps)
    replies = await fresh.send(minted("k:1"), create("mem:b", key="k:2"))
    assert fresh.refused_keys == 1
    assert "replay_of" in replies[0] and result(replies[1])["object_id"] == "mem:b"
    assert set(await store.load_idempotency([(SCOPE, "k:1"), (SCOPE, "k:2")])) == {(SCOPE, "k:1"), (SCOPE, "k:2")}


async def test_a_key_reused_for_another_request_is_a_duplicate_operation() -> None:
    store, shell = await started()
    await shell.send(minted("k:1", text="one"))
    [same_writer] = await shell.send(minted("k:1", text="two"))
    [new_writer] = await Shell(store, shell.stamps).send(minted("k:1", text="two"))
    assert code(same_writer) == code(new_writer) == "duplicate_operation"


async def test_a_retried_create_of_an_erased_object_replays_by_the_requests_shape() -> None:
    """The erasure forgot the record's content digest (store.ERASED_REQUEST); the request's shape still matches."""
    store, shell = await started()
    [made] = await shell.send(minted("k:1", text="secret"))
    await shell.send(delete(result(made)["object_id"], result(made)["version_id"]))
    record = (await store.load_idempotency([(SCOPE, "k:1")]))[(SCOPE, "k:1")]
    assert record.request_digest == forgotten(minted("k:1", text="secret").request_digest)
    [again] = await shell.send(minted("k:1", text="secret"))
    assert again == {"replay_of": record} and shell.refused_keys == 1  # the erasure emptied the cache


async def test_a_retried_update_replays_its_record_in_the_same_writer() -> None:
    store, shell = await started()
    [made] = await shell.send(create("mem:a"))
    retry = update("mem:a", result(made)["version_id"], "two", key="k:u")
    [moved] = await shell.send(retry)
    [again] = await shell.send(retry)
    assert again == {"replay_of": (await store.load_idempotency([(SCOPE, "k:u")]))[(SCOPE, "k:u")]}
    assert again["replay_of"].version_id == result(moved)["version_id"]


@pytest.mark.parametrize("retried", ["update", "create with its object id"])
async def test_a_retried_command_replays_its_record_after_a_writer_takeover(retried: str) -> None:
    store, shell = await started()
    [made] = await shell.send(create("mem:a"))
    retry = update("mem:a", result(made)["version_id"], "two", key="k:1") if retried == "update" \
        else create("mem:b", key="k:1")
    await shell.send(retry)
    [again] = await Shell(store, shell.stamps).send(retry)
    assert again == {"replay_of": (await store.load_idempotency([(SCOPE, "k:1")]))[(SCOPE, "k:1")]}


async def test_a_delegation_counts_its_uses_in_the_store_across_batches() -> None:
    store, shell = await started()
    granted = await shell.send(command("grant_delegation", delegation_id="del:1", granting_actor=PROV["actor"],
                                       delegated_actor={"actor_id": "actor:agent:helper", "actor_kind": "agent"},
                                       granted_operations=["read"], policy_basis="test", usage_limit=1,
                                       not_before="2026-01-01T00:00:00Z", not_after="2027-01-01T00:00:00Z"))
    assert result(granted[0])["delegation_id"] == "del:1"
    [used] = await shell.send(check("del:1"))
    [spent] = await Shell(store, shell.stamps).send(check("del:1"))
    assert "error" not in used and code(spent) == "access_denied"
    assert (await store.load_delegations(["del:1"]))["del:1"].uses == 1


async def test_many_batches_leave_one_gapless_chain_and_the_heads_the_replies_named() -> None:
    store, shell = await started()
    versions: dict[str, str] = {}
    for n in range(20):
        object_id = f"mem:{n % 4}"
        if object_id in versions:
            replies = await shell.send(update(object_id, versions[object_id], f"v{n}"), minted(f"k:{n}"))
        else:
            replies = await shell.send(create(object_id, text=f"v{n}"), minted(f"k:{n}"))
        versions[object_id] = result(replies[0])["version_id"]
    assert sorted(store.ledger) == list(range(1, 41))
    assert await store.broken_tail(40) is None
    heads = await store.load_heads([(SCOPE, o) for o in versions])
    assert {key[1]: head.version_id for key, head in heads.items()} == versions
    assert len(store.idempotency) == 20
