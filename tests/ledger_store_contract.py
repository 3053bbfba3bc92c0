"""The LedgerStore contract: one suite of tests that every store must pass, Postgres and in-memory alike.

Why one suite: the in-memory store stands in for Postgres in the fast tests of the writer's core, which is
only worth something while it behaves as Postgres does. A module subclasses LedgerStoreContract with a
`store` fixture (a fresh, empty store per test: a freshly migrated database), the exceptions its append
raises on a refused batch (`refusals`) and how to read the constraint one names (`constraint`).
Batches come from the real planner and core; what was appended is tracked from the plans (Ledger), never
read back from the store, so the store's reads are checked against what the planner wrote.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime, timedelta, timezone
from typing import Any, ClassVar

import msgspec
import pytest

from command_handler.core.chain import GENESIS_HASH
from command_handler.core.intake import Parsed, parse
from command_handler.core.planner import Plan, PlanInputs, plan_batch
from command_handler.core.state import ObjectHead, Stamp
from command_handler.core.batch import Batch, LedgerStore, forgotten
from infra.ledger import IdempotencyRow
from schemas.common import SYSTEM_SCOPE
from schemas.delegation import DelegationState
from schemas.registry import default_registry

SCOPE, OTHER, NEW = "workspace:contract", "workspace:contract-other", "workspace:contract-new"
ACTOR = {"actor_id": "actor:agent:contract", "actor_kind": "agent"}
PROV = {"provenance_id": "prov:contract", "actor": ACTOR, "activity": "test"}
NOW = datetime(2026, 11, 29, 12, 0, tzinfo=timezone.utc)
REGISTRY = default_registry()
SALT_B = b"b" * 16  # the salt of mem:b's content, so a test can make another row with its digest


def command(name: str, key: str | None = None, **body: Any) -> Parsed:
    """A command as the writer gets it: parsed from JSON, its idempotency key in the header."""
    body = {"scope_id": SCOPE, **body} if name == "create_scope" else {"scope_id": SCOPE, "actor": ACTOR, **body}
    return parse(name, msgspec.json.encode(body), {"Pam-Idempotency-Key": key} if key else {}, 1 << 20)


def scope(scope_id: str, policy: dict[str, Any] | None = None) -> Parsed:
    return command("create_scope", scope_id=scope_id, scope_kind="workspace", policy=policy)


def create(object_id: str, key: str | None = None, text: str = "x", scope_id: str = SCOPE,
           **content: str) -> Parsed:
    return command("create", key, scope_id=scope_id, object_id=object_id, object_type="claim",
                   canonical_content={"statement": text, **content}, provenance=PROV)


def update(object_id: str, expected: str, text: str, key: str | None = None) -> Parsed:
    return command("update", key, object_id=object_id, expected_version_id=expected,
                   canonical_content={"statement": text}, provenance=PROV)


def transition(object_id: str, expected: str, target: str = "corroborated", dimension: str = "validation",
               **extra: Any) -> Parsed:
    return command("transition", object_id=object_id, expected_version_id=expected, dimension=dimension,
                   target_state=target, provenance=PROV, **extra)


def delete(object_id: str, expected: str, key: str | None = None) -> Parsed:
    return command("delete", key, object_id=object_id, expected_version_id=expected, provenance=PROV)


def redact(object_id: str, expected: str, pointers: list[str] | None = None, erase: bool = True) -> Parsed:
    target: dict[str, Any] = {"erase": erase} if pointers is None else {"pointers": pointers, "erase": erase}
    return command("redact", object_id=object_id, expected_version_id=expected, provenance=PROV,
                   policy_basis="contract test", redaction_target=target)


def open_subscription(subscription_id: str, key: str | None = None) -> Parsed:
    return command("open_subscription", key, subscription_id=subscription_id, subscription={"filter": {}})


def grant(delegation_id: str) -> Parsed:
    return command("grant_delegation", delegation_id=delegation_id, granting_actor=ACTOR,
                   delegated_actor={"actor_id": "actor:agent:helper", "actor_kind": "agent"},
                   granted_operations=["read"], policy_basis="contract test",
                   not_before="2026-01-01T00:00:00Z", not_after="2027-01-01T00:00:00Z")


def check(delegation_id: str) -> Parsed:
    return command("check_delegation", delegation_id=delegation_id, delegated_actor_id="actor:agent:helper",
                   operation="read")


def seal(snapshot_id: str) -> Parsed:
    return command("snapshot_create", snapshot={"snapshot_id": snapshot_id})


class Stamps:
    """Stamps op:n, evt:n, ver:n numbered across every batch of a test (a second after NOW per n, salt n);
    `overrides` gives a named object's next stamp some fields of the test's choosing (a reused id)."""

    def __init__(self) -> None:
        self.n = 0  # the last number stamped
        self.overrides: dict[str, dict[str, Any]] = {"mem:b": {"salt": SALT_B}}

    def __call__(self, item: Parsed) -> Stamp:
        self.n += 1
        n = self.n
        object_id = getattr(item.command, "object_id", None) or f"mem:new{n}"
        fields: dict[str, Any] = dict(operation_id=f"op:{n}", event_id=f"evt:{n}", version_id=f"ver:{n}",
                                      object_id=object_id, now=NOW + timedelta(seconds=n), salt=n.to_bytes(16, "big"))
        fields.update(self.overrides.pop(object_id, {}))
        return Stamp(**fields)

    def version(self, ahead: int = 1) -> str:
        """The version id the `ahead`-th next stamp gives."""
        return f"ver:{self.n + ahead}"


class Ledger:
    """What the plans say has been appended, kept from the plans alone: heads, idempotency records, scopes,
    delegations, contents and the chain's tail, as the writer's caches would hold them."""

    def __init__(self) -> None:
        self.heads: dict[tuple[str, str], ObjectHead] = {}
        self.records: dict[tuple[str, str], IdempotencyRow] = {}
        self.scopes = {SYSTEM_SCOPE}
        self.delegations: dict[str, DelegationState] = {}
        self.contents: dict[str, bytes] = {}
        self.tail = (0, GENESIS_HASH)
        self.stamps = Stamps()
        self.recorded_at: dict[tuple[str, str], datetime] = {}  # each object's first version's commit time

    def plan(self, items: list[Parsed], **inputs: Any) -> Plan:
        """The planner's batch for these commands (each must be accepted); `inputs` override PlanInputs."""
        given: dict[str, Any] = dict(heads=self.heads, idempotency=self.records, scope_known=self.scopes.__contains__,
                                     stamp=self.stamps, tail=self.tail, registry=REGISTRY, contents=self.contents,
                                     delegations=self.delegations)
        plan = plan_batch(list(items), PlanInputs(**{**given, **inputs}))
        assert [o.error for o in plan.outcomes] == [None] * len(items)
        return plan

    def took(self, plan: Plan) -> None:
        """The plan's batch was appended."""
        self.heads.update(plan.heads)
        self.records.update(plan.idempotency)
        self.scopes |= plan.new_scopes
        self.delegations.update(plan.delegations)
        self.contents.update((c.content_digest, c.content) for c in plan.batch.content)
        rows = {row.ledger_sequence: row for row in plan.batch.ledger}
        for version in plan.batch.versions:
            if version.sequence == 1:
                self.recorded_at[(version.scope_id, version.object_id)] = rows[version.ledger_sequence].recorded_at
        self.tail = plan.tail

    async def commit(self, store: LedgerStore, *items: Parsed) -> Plan:
        plan = self.plan(list(items))
        await store.append(plan.batch)
        self.took(plan)
        return plan

    def head(self, object_id: str, scope_id: str = SCOPE) -> ObjectHead:
        return self.heads[(scope_id, object_id)]

    def digest(self, object_id: str, scope_id: str = SCOPE) -> str:
        found = self.head(object_id, scope_id).content_digest
        assert found is not None
        return found


async def reads(store: LedgerStore, ledger: Ledger, keys: list[tuple[str, str]], ids: list[tuple[str, str]],
                scopes: list[str], digests: list[str]) -> dict[str, Any]:
    """Everything the store answers about these objects, idempotency keys, scopes and digests."""
    return {
        "tail": await store.tail(), "broken": await store.broken_tail(100),
        "heads": await store.load_heads(keys), "restorable": await store.load_restorable(keys),
        "created_at": await store.load_created_at(keys), "contents": await store.load_contents(digests),
        "idempotency": await store.load_idempotency(ids), "known": await store.known_scopes(scopes),
        "policies": await store.load_scope_policies(scopes),
        "delegations": await store.load_delegations(sorted(ledger.delegations) + ["del:mates"]),
    }


KEYS = [(SCOPE, o) for o in ("mem:a", "mem:b", "mem:c", "mem:dup")] + [(OTHER, "mem:a")]
IDS = [(SCOPE, k) for k in ("k:a", "k:b", "k:c", "k:u", "k:del", "k:sub", "k:x")]

# A batch that breaks one rule (the constraint that refuses it, None where Postgres names none) besides
# commands that would all be fine alone: each builds it from the ledger and those mates.
Conflict = Callable[[Ledger, list[Parsed]], Batch]


def _stale_tail(ledger: Ledger, mates: list[Parsed]) -> Batch:
    return ledger.plan(mates, tail=(ledger.tail[0] - 1, ledger.tail[1])).batch


def _reused_event_id(ledger: Ledger, mates: list[Parsed]) -> Batch:
    ledger.stamps.overrides["mem:dup"] = {"event_id": "evt:1"}
    return ledger.plan([*mates, create("mem:dup")]).batch


def _reused_version_id(ledger: Ledger, mates: list[Parsed]) -> Batch:
    ledger.stamps.overrides["mem:dup"] = {"version_id": ledger.head("mem:b").version_id}
    return ledger.plan([*mates, create("mem:dup")]).batch


def _existing_object(ledger: Ledger, mates: list[Parsed]) -> Batch:
    """mem:b created again by a planner that did not know it (a head it was not given)."""
    heads = {key: head for key, head in ledger.heads.items() if key != (SCOPE, "mem:b")}
    return ledger.plan([*mates, create("mem:b")], heads=heads).batch


def _reused_content_digest(ledger: Ledger, mates: list[Parsed]) -> Batch:
    ledger.stamps.overrides["mem:dup"] = {"salt": SALT_B}
    return ledger.plan([*mates, create("mem:dup", text="b")]).batch


def _key_seen_before(ledger: Ledger, mates: list[Parsed]) -> Batch:
    """The writer's optimistic path: planned without the key's record, which the store already holds."""
    return ledger.plan([*mates, create("mem:dup", key="k:a")], idempotency={}).batch


def _record_without_version(ledger: Ledger, mates: list[Parsed]) -> Batch:
    batch = ledger.plan(mates).batch
    batch.idempotency[0] = msgspec.structs.replace(batch.idempotency[0], version_id=None)
    return batch


def _delegation_twice(ledger: Ledger, mates: list[Parsed]) -> Batch:
    batch = ledger.plan(mates).batch
    batch.delegations = batch.delegations * 2
    return batch


CONFLICTS: list[tuple[Conflict, str | None]] = [
    (_stale_tail, "ledger_pkey"),
    (_reused_event_id, "ledger_event_id_key"),
    (_reused_version_id, "memory_versions_version_id_key"),
    (_existing_object, "memory_versions_pkey"),
    (_reused_content_digest, "content_store_pkey"),
    (_key_seen_before, "idempotency_records_pkey"),
    (_record_without_version, "idempotency_records_version_or_entry"),
    (_delegation_twice, None),  # Postgres: cardinality_violation (ON CONFLICT cannot touch a row twice)
]


class LedgerStoreContract:
    """The behaviour every LedgerStore has. Subclasses give the `store` fixture and how refusals look."""

    refusals: ClassVar[tuple[type[BaseException], ...]]

    @staticmethod
    def constraint(exc: BaseException) -> str | None:
        raise NotImplementedError

    async def test_an_empty_store_holds_no_rows_and_knows_the_system_scope(self, store: LedgerStore) -> None:
        ledger = Ledger()
        assert await store.tail() == (0, GENESIS_HASH)
        assert await store.broken_tail(10) is None
        assert await reads(store, ledger, KEYS, IDS, [SCOPE, SYSTEM_SCOPE], ["sha256:none"]) == {
            "tail": (0, GENESIS_HASH), "broken": None, "heads": {}, "restorable": {}, "created_at": {},
            "contents": {}, "idempotency": {}, "known": {SYSTEM_SCOPE}, "policies": {SYSTEM_SCOPE: None},
            "delegations": {}}

    async def test_no_keys_read_nothing_and_an_empty_batch_writes_nothing(self, store: LedgerStore) -> None:
        await store.append(Batch(ledger=[], versions=[], content=[], idempotency=[], erase=[], scopes=[]))
        assert await store.tail() == (0, GENESIS_HASH)
        assert (await store.load_heads([]), await store.load_idempotency([]), await store.load_restorable([]),
                await store.load_created_at([]), await store.load_contents([]), await store.load_delegations([]),
                await store.load_scope_policies([]), await store.known_scopes([])) == (
                    {}, {}, {}, {}, {}, {}, {}, set())

    async def test_created_scopes_are_known_with_their_policies(self, store: LedgerStore) -> None:
        ledger = Ledger()
        policy = {"retention": {"minimum_days": 30}, "note": "caf\u00e9", "weights": [1, 2.5]}
        await ledger.commit(store, scope(SCOPE, policy), scope(OTHER))
        assert await store.known_scopes([SCOPE, OTHER, NEW]) == {SCOPE, OTHER}
        assert await store.load_scope_policies([SCOPE, OTHER, NEW]) == {SCOPE: policy, OTHER: None}

    async def test_a_scope_created_again_keeps_its_first_policy(self, store: LedgerStore) -> None:
        """The planner that does not know a scope adds its row again: the store keeps the first, refusing nothing."""
        ledger = Ledger()
        await ledger.commit(store, scope(SCOPE, {"first": True}))
        again = ledger.plan([scope(SCOPE, {"first": False}), create("mem:a")], scope_known=lambda _: False)
        assert again.batch.scopes and again.batch.ledger
        await store.append(again.batch)
        assert await store.load_scope_policies([SCOPE]) == {SCOPE: {"first": True}}
        assert await store.known_scopes([SCOPE]) == {SCOPE}
        assert (SCOPE, "mem:a") in await store.load_heads([(SCOPE, "mem:a")])

    async def test_appended_versions_are_read_back_as_each_objects_head(self, store: LedgerStore) -> None:
        ledger = Ledger()
        await ledger.commit(store, scope(SCOPE), scope(OTHER), create("mem:a", text="one"), create("mem:b"),
                            create("mem:c"), create("mem:a", scope_id=OTHER))
        a, b = ledger.head("mem:a"), ledger.head("mem:b")
        second = await ledger.commit(store, update("mem:a", a.version_id, "two"), transition("mem:b", b.version_id))
        assert await store.load_heads(KEYS) == {key: ledger.heads[key] for key in KEYS if key in ledger.heads}
        assert ledger.head("mem:a") == second.heads[(SCOPE, "mem:a")] and ledger.head("mem:a").sequence == 2
        assert ledger.head("mem:a", OTHER).sequence == 1  # the same object id in another scope is another object

    async def test_contents_are_read_by_digest_and_their_creation_time_by_object(self, store: LedgerStore) -> None:
        ledger = Ledger()
        await ledger.commit(store, scope(SCOPE), create("mem:a", text="one"), create("mem:b", text="b"))
        first = ledger.digest("mem:a")
        await ledger.commit(store, update("mem:a", ledger.head("mem:a").version_id, "two"), create("mem:c"))
        digests = [first, ledger.digest("mem:a"), ledger.digest("mem:b"), ledger.digest("mem:c"), "sha256:none"]
        contents = await store.load_contents(digests)
        assert contents == {d: ledger.contents[d] for d in digests[:4]}
        assert contents[first] == b'{"statement":"one"}'
        created = await store.load_created_at(KEYS)
        assert created == ledger.recorded_at and set(created) == {(SCOPE, "mem:a"), (SCOPE, "mem:b"), (SCOPE, "mem:c")}
        assert created[(SCOPE, "mem:a")] < created[(SCOPE, "mem:c")]  # the first version's, not the head's

    async def test_idempotency_records_are_read_by_scope_and_key(self, store: LedgerStore) -> None:
        ledger = Ledger()
        plan = await ledger.commit(store, scope(SCOPE), create("mem:a", key="k:a"), open_subscription("sub:1", "k:sub"))
        records = await store.load_idempotency(IDS + [(OTHER, "k:a")])
        assert records == ledger.records and set(records) == {(SCOPE, "k:a"), (SCOPE, "k:sub")}
        assert records[(SCOPE, "k:a")].version_id == ledger.head("mem:a").version_id
        entry = records[(SCOPE, "k:sub")]
        assert (entry.object_id, entry.version_id, entry.ledger_sequence) == (None, None, plan.tail[0])

    async def test_delegations_are_read_with_their_uses_and_keep_their_grant(self, store: LedgerStore) -> None:
        ledger = Ledger()
        await ledger.commit(store, scope(SCOPE), grant("del:1"))
        await ledger.commit(store, check("del:1"))
        state = (await store.load_delegations(["del:1", "del:none"]))["del:1"]
        assert state == ledger.delegations["del:1"] and state.uses == 1 and not state.revoked
        changed = msgspec.structs.replace(state, scope_id=OTHER, grant={"forged": True}, uses=5, revoked=True)
        await store.append(Batch(ledger=[], versions=[], content=[], idempotency=[], erase=[], scopes=[],
                                 delegations=[changed]))
        assert await store.load_delegations(["del:1"]) == {
            "del:1": msgspec.structs.replace(state, uses=5, revoked=True)}  # uses and revoked move, nothing else

    async def test_sealed_snapshots_are_known_by_id_and_an_id_sealed_again_is_refused(
            self, store: LedgerStore) -> None:
        ledger = Ledger()
        made = await ledger.commit(store, scope(SCOPE), create("mem:a"), seal("snap:1"))
        assert await store.sealed_snapshots(["snap:1", "snap:none"]) == {"snap:1"}
        assert await store.sealed_snapshots([]) == set()
        await ledger.commit(store, update("mem:a", ledger.head("mem:a").version_id, "again"))
        assert await store.first_sequences([(SCOPE, "mem:a"), (SCOPE, "mem:none"), (OTHER, "mem:a")]) == {
            (SCOPE, "mem:a"): made.batch.versions[0].ledger_sequence}  # its first version's, not its latest's
        assert await store.first_sequences([]) == {}
        tail = await store.tail()
        again = ledger.plan([seal("snap:1")])  # a planner that was not told snap:1 is sealed
        with pytest.raises(self.refusals) as raised:
            await store.append(again.batch)
        assert self.constraint(raised.value) == "evaluation_snapshots_pkey"
        assert await store.tail() == tail

    async def test_the_tail_is_the_last_rows_sequence_and_hash_and_the_chain_links(self, store: LedgerStore) -> None:
        ledger = Ledger()
        first = await ledger.commit(store, scope(SCOPE), create("mem:a"), create("mem:b"))
        assert await store.tail() == first.tail == (2, first.batch.ledger[-1].row_hash)
        second = await ledger.commit(store, open_subscription("sub:1"), create("mem:c"))
        assert await store.tail() == second.tail == (4, second.batch.ledger[-1].row_hash)
        assert second.batch.ledger[0].prev_hash == first.tail[1]
        assert [await store.broken_tail(n) for n in (1, 2, 4, 100)] == [None] * 4

    @pytest.mark.parametrize("forgery, problem", [
        ("row_hash", "ledger row 4: row_hash does not match the row's bytes"),
        ("prev_hash", "ledger row 3: prev_hash does not match the previous row's hash"),
        ("gap", "sequence gap before ledger row 4"),
    ])
    async def test_the_store_appends_a_forged_chain_and_its_broken_tail_names_the_row(
            self, store: LedgerStore, forgery: str, problem: str) -> None:
        """No store checks the chain on append (the planner makes it; the writer's guard reads broken_tail)."""
        ledger = Ledger()
        await ledger.commit(store, scope(SCOPE), create("mem:a"), create("mem:b"))
        tail = (ledger.tail[0] + 1, ledger.tail[1]) if forgery == "gap" else \
            (ledger.tail[0], b"\x01" * 32) if forgery == "prev_hash" else ledger.tail
        plan = ledger.plan([create("mem:c"), create("mem:d")], tail=tail)
        if forgery == "row_hash":
            plan.batch.ledger[-1] = msgspec.structs.replace(plan.batch.ledger[-1], row_hash=b"\x02" * 32)
        await store.append(plan.batch)
        assert await store.broken_tail(100) == problem
        assert (await store.tail())[0] == plan.tail[0]
        # A row alone: only its own hash can be checked.
        assert await store.broken_tail(1) == (problem if forgery == "row_hash" else None)

    async def test_a_row_filling_a_gap_leaves_the_tail_at_the_highest_sequence(self, store: LedgerStore) -> None:
        ledger = Ledger()
        await ledger.commit(store, scope(SCOPE), create("mem:a"), create("mem:b"))
        below = ledger.tail
        above = ledger.plan([create("mem:c"), create("mem:d")], tail=(below[0] + 1, below[1]))
        await store.append(above.batch)
        await store.append(ledger.plan([create("mem:e")], tail=below).batch)  # row 3, under rows 4 and 5
        assert await store.tail() == above.tail
        assert await store.broken_tail(100) == "ledger row 4: prev_hash does not match the previous row's hash"

    @pytest.mark.parametrize("conflict, constraint", CONFLICTS, ids=[c.__name__.strip("_") for c, _ in CONFLICTS])
    async def test_a_refused_batch_leaves_nothing_and_the_same_batch_without_its_conflict_commits(
            self, store: LedgerStore, conflict: Conflict, constraint: str | None) -> None:
        ledger = Ledger()
        await ledger.commit(store, scope(SCOPE), create("mem:a", key="k:a", text="a"), create("mem:b", text="b"),
                            open_subscription("sub:1", "k:sub"))
        # Mates: a new scope, a create with a key, an erasure of a keyed object, a delegation's new state.
        mates = [scope(NEW), create("mem:c", key="k:c"), delete("mem:a", ledger.head("mem:a").version_id, "k:del"),
                 grant("del:mates")]
        digests = [ledger.digest("mem:a"), ledger.digest("mem:b")]
        before = await reads(store, ledger, KEYS, IDS, [SCOPE, NEW], digests)
        start = ledger.stamps.n
        refused = conflict(ledger, mates)
        with pytest.raises(self.refusals) as raised:
            await store.append(refused)
        if constraint is not None:
            assert self.constraint(raised.value) == constraint
        digests += [c.content_digest for c in refused.content]
        assert await reads(store, ledger, KEYS, IDS, [SCOPE, NEW], digests) == {
            **before, "contents": {d: ledger.contents[d] for d in digests[:2]}}
        assert before["idempotency"][(SCOPE, "k:a")] == ledger.records[(SCOPE, "k:a")]  # not forgotten
        ledger.stamps.n = start  # the same ids again: a store that kept any of them refuses this batch
        plan = ledger.plan(mates)
        await store.append(plan.batch)
        ledger.took(plan)
        assert await store.tail() == plan.tail
        assert (await store.load_heads([(SCOPE, "mem:a")]))[(SCOPE, "mem:a")].deleted
        assert await store.known_scopes([NEW]) == {NEW}
        assert await store.load_delegations(["del:mates"]) == {"del:mates": ledger.delegations["del:mates"]}

    async def test_an_erasure_deletes_the_objects_content_and_forgets_earlier_request_digests(
            self, store: LedgerStore) -> None:
        ledger = Ledger()
        await ledger.commit(store, scope(SCOPE), create("mem:a", key="k:a", text="one"), create("mem:b", key="k:b"))
        first = ledger.digest("mem:a")
        await ledger.commit(store, update("mem:a", ledger.head("mem:a").version_id, "two", key="k:u"))
        second, kept = ledger.digest("mem:a"), ledger.digest("mem:b")
        recorded = dict(ledger.records)
        await ledger.commit(store, delete("mem:a", ledger.head("mem:a").version_id, key="k:del"))
        assert await store.load_contents([first, second, kept]) == {kept: ledger.contents[kept]}
        records = await store.load_idempotency(IDS)
        assert {key: r.request_digest for key, r in records.items()} == {
            (SCOPE, "k:a"): forgotten(recorded[(SCOPE, "k:a")].request_digest),
            (SCOPE, "k:u"): forgotten(recorded[(SCOPE, "k:u")].request_digest),
            (SCOPE, "k:b"): recorded[(SCOPE, "k:b")].request_digest,  # another object's
            (SCOPE, "k:del"): ledger.records[(SCOPE, "k:del")].request_digest,  # the erasing entry's own
        }
        head = (await store.load_heads([(SCOPE, "mem:a")]))[(SCOPE, "mem:a")]
        assert head == ledger.head("mem:a") and head.deleted and head.content_digest is None
        assert await store.load_restorable([(SCOPE, "mem:a")]) == {}

    async def test_content_of_an_object_erased_in_its_own_batch_is_never_kept(self, store: LedgerStore) -> None:
        ledger = Ledger()
        await ledger.commit(store, scope(SCOPE))
        stamps = ledger.stamps
        plan = ledger.plan([create("mem:x", key="k:x", text="secret"), update("mem:x", stamps.version(1), "more"),
                            delete("mem:x", stamps.version(2)), create("mem:b")])
        assert len(plan.batch.content) == 3 and plan.batch.erase
        await store.append(plan.batch)
        ledger.took(plan)
        assert await store.load_contents([c.content_digest for c in plan.batch.content]) == {
            ledger.digest("mem:b"): ledger.contents[ledger.digest("mem:b")]}
        record = (await store.load_idempotency([(SCOPE, "k:x")]))[(SCOPE, "k:x")]
        assert record.request_digest == forgotten(plan.idempotency[(SCOPE, "k:x")].request_digest)
        assert (await store.load_heads([(SCOPE, "mem:x")]))[(SCOPE, "mem:x")].deleted

    async def test_a_partial_redaction_keeps_its_projection_alone(self, store: LedgerStore) -> None:
        ledger = Ledger()
        await ledger.commit(store, scope(SCOPE), create("mem:a", text="s", secret="p"))
        original = ledger.digest("mem:a")
        await ledger.commit(store, redact("mem:a", ledger.head("mem:a").version_id, ["/secret"]))
        projection = ledger.digest("mem:a")
        assert await store.load_contents([original, projection]) == {
            projection: b'{"secret":"[REDACTED]","statement":"s"}'}
        assert (await store.load_heads([(SCOPE, "mem:a")]))[(SCOPE, "mem:a")].state("availability") == \
            "partially_redacted"

    async def test_two_erasing_partial_redactions_in_one_batch_keep_the_heads_projection(
            self, store: LedgerStore) -> None:
        """The planner threads heads through a batch, so a second redaction may follow the first in it."""
        ledger = Ledger()
        await ledger.commit(store, scope(SCOPE), create("mem:a", text="s", one="1", two="2"))
        plan = ledger.plan([redact("mem:a", ledger.head("mem:a").version_id, ["/one"]),
                            redact("mem:a", ledger.stamps.version(1), ["/two"])])
        assert len(plan.batch.erase) == 2
        await store.append(plan.batch)
        ledger.took(plan)
        head = ledger.digest("mem:a")
        assert await store.load_contents([head]) == {head: b'{"one":"[REDACTED]","statement":"s","two":"[REDACTED]"}'}

    async def test_a_suppressed_content_stays_restorable_and_an_erased_one_does_not(self, store: LedgerStore) -> None:
        ledger = Ledger()
        await ledger.commit(store, scope(SCOPE), create("mem:a", text="one"), create("mem:b"), create("mem:c"))
        await ledger.commit(store, update("mem:a", ledger.head("mem:a").version_id, "two"))
        latest = ledger.digest("mem:a")
        await ledger.commit(store, redact("mem:a", ledger.head("mem:a").version_id, erase=False),
                            redact("mem:b", ledger.head("mem:b").version_id, erase=True))
        assert ledger.head("mem:a").content_digest is None
        assert await store.load_restorable(KEYS) == {(SCOPE, "mem:a"): latest, (SCOPE, "mem:c"): ledger.digest("mem:c")}
        restored = ledger.plan([transition("mem:a", ledger.head("mem:a").version_id, "available", "availability",
                                           policy_basis="restoration: contract")],
                               restorable=await store.load_restorable([(SCOPE, "mem:a")]))
        await store.append(restored.batch)
        assert restored.heads[(SCOPE, "mem:a")].content_digest == latest
        assert (await store.load_heads([(SCOPE, "mem:a")]))[(SCOPE, "mem:a")].content_digest == latest
