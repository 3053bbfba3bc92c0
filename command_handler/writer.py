"""The single writer's shell: leadership, the inbox, group commit, replies after COMMIT, relay hand-off.

Ordering and durability: a batch is decided in arrival order against head state, written in ONE
transaction on the connection that holds the partition's advisory lock, and only after COMMIT returns
are caches advanced, replies sent and rows handed to the relay. If the commit fails nothing in memory
moves, so the next batch starts from the last committed tail.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Callable
from typing import Any, NamedTuple

import msgspec
import psycopg
import structlog
from nats.aio.msg import Msg

from authz.audit import DenialLimiter
from command_handler.core.redactions import minimum_retention_days
from command_handler.erasure_journal import catch_up, erasures_in, journal_for
from command_handler.core.references import delegation_named, erases_content, head_keys
from command_handler.stamps import new_stamp
from command_handler.denials import admit, authority_of, refusal_entry
from command_handler.guard import AppendGuard
from command_handler.core.intake import Parsed, parse, space_key
from command_handler.core.planner import Outcome, Plan, PlanInputs, known_result_bytes, plan_batch, refused_before_key_check
from command_handler.core.imports import entry_ids
from command_handler.batch_trace import BatchTimes, TracedCommand, trace_batch
from command_handler.core.evaluation import EvaluationRun, forkable, forked_head, run_of
from command_handler.core.validation import needs_scope_policy
from command_handler.core.state import ImportFacts, ObjectHead
from command_handler.store import PostgresLedgerStore
from infra import tracing
from infra.db_errors import map_db_error
from infra.ledger import IdempotencyRow, LedgerRow, fetch_replay
from infra.lru import LRU
from infra.metrics import BATCH_SIZE, COMMIT_SECONDS, DENIALS_TOTAL, LEDGER_HEAD, PARTITION_HEAD, PARTITION_RELAY_LAG, \
    RELAY_LAG, REPLY_SECONDS, count_commands, rule_label
from infra.nats_raw import RawClient, parse_headers
from infra.request_shell import AllowAll, Policy, error_body, to_error
from infra.settings import Settings
from infra.status import status_reply
from pamledger_client.protocol.subjects import command_subject, partition_command_subject, status_subject
from schemas.canonical import canonical_bytes
from schemas.common import SYSTEM_SCOPE
from schemas.snapshots import CreateSnapshot
from schemas.evaluation import StartEvaluation
from schemas.bundle import chunk_key
from schemas.commands import CorrectProvenance, CreateScope, ImportEntries, TransitionState
from schemas.redaction import Redact
from schemas.errors import PamledgerError
from schemas.registry import TypeRegistry, default_registry
from schemas.replies import OPERATION_HEADER, entry_result_bytes, error_reply, result_bytes

log = structlog.get_logger(__name__)


class Writer:
    """Serves the command subjects while it holds the partition lock."""

    def __init__(
        self, settings: Settings, nc: RawClient, store: PostgresLedgerStore,
        committed: Callable[[list[LedgerRow]], None], relay_status: Callable[[], dict[str, Any]],
        registry: TypeRegistry | None = None, policy: Policy | None = None,
        local: dict[int, Callable[[Command], None]] | None = None,
    ):
        self.settings = settings
        self.nc = nc
        self.store = store
        # After COMMIT the rows go to `committed` (the relay's queue, command_handler.relay); the writer never
        # waits for replication. `relay_status` says how far replication got, for the writer's status reply.
        self.committed = committed
        # Asked once per command, after it decoded and before it is planned (authz.enforce.TokenPolicy,
        # or AllowAll where auth is off); refusals are recorded in the batch (command_handler.denials).
        self.policy: Policy = policy or AllowAll()
        self.denial_limiter = DenialLimiter(settings.auth.denial_burst, settings.auth.denial_every_seconds)
        self.relay_status = relay_status
        # Built once, never per command: the core reads its type and transition tables from this value.
        self.registry = registry if registry is not None else default_registry()
        self.inbox: asyncio.Queue[Command] = asyncio.Queue()
        cache = settings.writer.head_cache_size
        self.heads: LRU[tuple[str, str], ObjectHead] = LRU(cache)
        self.idempotency: LRU[tuple[str, str], IdempotencyRow] = LRU(cache)
        self.scopes: LRU[str, bool] = LRU(cache)
        self.scope_policies: LRU[str, Any] = LRU(cache)  # a scope's policy never changes once created
        self.tail: tuple[int, bytes] = (0, b"")
        self.guard = AppendGuard(settings, store, nc)  # while it refuses, nothing is appended
        self.journal = journal_for(settings)  # every erasure, outside the database (command_handler.erasure_journal)
        self.ledger_id: str | None = None
        # Every evaluation run by its scope, with the scope's entry count (few: loaded whole at serve()).
        self.runs: dict[str, EvaluationRun] = {}
        self._subs: list[Any] = []
        self._decided_ns = 0  # when the batch being committed was decided (only while tracing is on)
        # The writers this process leads, by partition: the router (command_handler.router) hands them their
        # commands without a hop through NATS. This writer is in it while it serves.
        self.local = local

    async def serve(self) -> None:
        """Subscribe and run group commits until cancelled."""
        await self.guard.check()
        self.tail = await self.store.tail()
        self.runs = {run.scope_id: run for run in (run_of(*row) for row in await self.store.evaluation_runs())}
        await self._journal_catch_up()
        head = lambda: float(self.tail[0])  # noqa: E731
        lag = lambda: float(self.tail[0] - int(self.relay_status().get("relayed_sequence", 0)))  # noqa: E731
        if self.store.partition == self.settings.partition:  # with several partitions: partition 0's (and below)
            LEDGER_HEAD.set_function(head)
            RELAY_LAG.set_function(lag)
        if self.settings.partitions > 1:
            PARTITION_HEAD.labels(str(self.store.partition)).set_function(head)
            PARTITION_RELAY_LAG.labels(str(self.store.partition)).set_function(lag)
        prefix = self.settings.subject_prefix
        partition = self.store.partition
        # One wildcard subscription: unknown command names get an invalid_request, not silence. Raw
        # deliveries go straight into the inbox from the client's read loop (no Msg, no task hop). With
        # several partitions the router sends this partition's commands to a subject of its own.
        if self.settings.partitions == 1:
            self._subs.append(await self.nc.subscribe_raw(command_subject(prefix, "*"), self._on_command,
                                                          queue="pamledger-writer"))
        else:
            self._subs.append(await self.nc.subscribe_raw(partition_command_subject(prefix, partition, "*"),
                                                          self._on_routed, queue=f"pamledger-writer-p{partition}"))
            self._subs.append(await self.nc.subscribe(status_subject(prefix, f"writer.p{partition}"), cb=self._status))
        self._subs.append(await self.nc.subscribe(status_subject(prefix, "writer"), cb=self._status))
        await self.nc.flush()
        if self.local is not None:
            self.local[partition] = self.inbox.put_nowait
        log.info("writer.serving", ledger_sequence=self.tail[0], partition=self.store.partition)
        try:
            while True:
                first = await self.inbox.get()
                batch = [first]
                while len(batch) < self.settings.writer.max_batch and not self.inbox.empty():
                    batch.append(self.inbox.get_nowait())
                await self._commit_batch(batch)
        finally:
            if self.local is not None and self.local.get(partition) == self.inbox.put_nowait:
                del self.local[partition]
            for sub in self._subs:
                await self.nc.unsubscribe_raw(sub)

    def _on_command(self, subject: bytes, reply: bytes, data: bytes, headers: bytes | None) -> None:
        self.inbox.put_nowait(Command(subject.decode(), reply.decode(), data, parse_headers(headers)))

    def _on_routed(self, subject: bytes, reply: bytes, data: bytes, headers: bytes | None) -> None:
        """A command the router sent to this partition: from here on it is the command as its client sent it
        (`{prefix}.cmd.<name>`), so policy, logs and metrics see the same subject whatever the partition."""
        name = subject.rsplit(b".", 1)[-1].decode()
        self.inbox.put_nowait(Command(command_subject(self.settings.subject_prefix, name), reply.decode(), data,
                                      parse_headers(headers)))

    async def _status(self, msg: Msg) -> None:
        health = {"role": "writer", "leader": True, "ok": self.guard.refusal() is None}
        await msg.respond(status_reply(self.policy, msg.subject, msg.headers, health, lambda: {
            "role": "leader", "partition": self.store.partition, "ledger_sequence": self.tail[0],
            "pid": os.getpid(), **self.guard.status(), **self.relay_status(),
        }))

    async def _commit_batch(self, msgs: list[Command], items: list[Parsed | PamledgerError] | None = None) -> None:
        """Commit one batch. `items` are the batch's commands already parsed (and decided on by the policy)
        when a failed batch is split: each command is parsed and authorized once, however it is retried."""
        if self.guard.due():
            await self.guard.check()
            self.tail = await self.store.tail()
        if (refusal := self.guard.refusal()) is not None:
            await self._fail_all(msgs, msgs, refusal)
            return
        if items is None:
            items = [self._parse(m) for m in msgs]
        parsed = [i for i in items if isinstance(i, Parsed)]
        started = time.perf_counter()
        started_ns = time.time_ns() if tracing.ENABLED else 0
        try:
            plan = await self._plan_and_append(items, parsed)
        except PamledgerError as exc:
            await self._fail_all(msgs, items, exc)
            return
        except psycopg.Error as exc:
            alive = not (self.store.conn.broken or self.store.conn.closed)
            if alive and len(msgs) > 1 and not isinstance(exc, psycopg.OperationalError):
                # Postgres refused some command's rows (a constraint, a value it cannot store). Nothing was
                # written and nothing in memory moved: commit each command alone, so only the offender fails.
                log.warning("batch.split", error=type(exc).__name__, size=len(msgs))
                for msg, item in zip(msgs, items):
                    await self._commit_batch([msg], [item])
                return
            log.error("batch.failed", error=type(exc).__name__, size=len(msgs),
                      constraint=getattr(getattr(exc, "diag", None), "constraint_name", None))
            await self._fail_all(msgs, items, map_db_error(exc))
            if not alive:
                raise
            return
        except Exception:  # noqa: BLE001 - a bug, not Postgres: nothing was written, so split as above
            log.exception("batch.crashed", size=len(msgs))
            if len(msgs) > 1:
                for msg, item in zip(msgs, items):
                    await self._commit_batch([msg], [item])
            else:
                await self._fail_all(msgs, items, PamledgerError("internal error while handling the command"))
            return
        COMMIT_SECONDS.observe(time.perf_counter() - started)
        BATCH_SIZE.observe(len(msgs))
        committed_ns = time.time_ns() if tracing.ENABLED else 0
        self._advance(plan)
        if plan.batch.erase:
            await self._journal(plan.batch.ledger)  # before the reply: an acknowledged erasure is journaled
        await self._reply(msgs, items, plan)
        REPLY_SECONDS.observe(time.perf_counter() - started)
        count_commands((_name(m), _outcome(o)) for m, o in zip(msgs, plan.outcomes))
        if tracing.ENABLED:  # before the relay gets the rows: it takes each command's context over
            trace_batch([TracedCommand(_name(m), _outcome(o), _ledger_op_id(o) or _op_id(m, i), m.headers)
                         for m, i, o in zip(msgs, items, plan.outcomes)],
                        BatchTimes(started_ns, self._decided_ns or started_ns, committed_ns, time.time_ns()),
                        plan.tail[0])
        if plan.batch.ledger:
            self.committed(plan.batch.ledger)

    async def _plan_and_append(self, items: list[Parsed | PamledgerError], parsed: list[Parsed]) -> Plan:
        """Plan and append. Idempotency keys are checked optimistically: the records' primary key refuses a
        key seen before (the statement then writes nothing), and the batch is planned again with those
        records loaded, so a retried command replays its original result; a keyed command refused before
        its key was looked up has the batch planned again with the records first (refused_before_key_check)."""
        inputs = await self._load(parsed, with_idempotency=False)
        plan = plan_batch(items, inputs)
        if refused_before_key_check(items, plan, lambda key: self.idempotency.get(key) is not None):
            plan = plan_batch(items, await self._load(parsed, with_idempotency=True))
        if tracing.ENABLED:
            self._decided_ns = time.time_ns()
        if not (plan.batch.ledger or plan.batch.scopes):
            return plan
        try:
            await self.store.append(plan.batch)
            return plan
        except psycopg.errors.UniqueViolation as exc:
            if exc.diag.constraint_name != "idempotency_records_pkey":
                raise
        inputs = await self._load(parsed, with_idempotency=True)
        plan = plan_batch(items, inputs)
        if plan.batch.ledger or plan.batch.scopes:
            await self.store.append(plan.batch)
        return plan

    def _parse(self, msg: Command) -> Parsed | PamledgerError:
        name = msg.subject.rsplit(".", 1)[-1]
        try:
            parsed = parse(name, msg.data, msg.headers, self.settings.writer.max_payload_bytes)
            admitted = admit(self.policy, self.denial_limiter, parsed, msg.subject, msg.headers)
            if admitted is not parsed:
                rule = getattr(admitted.refusal if isinstance(admitted, Parsed) else admitted, "rule_id", None)
                DENIALS_TOTAL.labels(rule_label(rule)).inc()
                log.info("request.denied", request=f"cmd.{name}", rule_id=rule)
            return admitted
        except PamledgerError as exc:
            log.info("command.rejected", code=exc.code, command=name, reason=exc.message[:200])
            return exc
        except Exception as exc:  # noqa: BLE001 - a bug in parsing answers this command alone
            return to_error(exc, f"{name} command")

    async def _load(self, parsed: list[Parsed], with_idempotency: bool) -> PlanInputs:
        """Fetch, in one query each, the heads, scopes (and, when asked, idempotency records) the caches lack."""
        to_load: set[tuple[str, str]] = set()
        idem_keys, scope_ids = set(), set()
        for p in parsed:
            if isinstance(p.command, CreateScope):
                scope_ids.add(p.command.scope_id)
                continue
            to_load.update(k for k in head_keys(p.command) if k not in self.heads)
            if with_idempotency and p.idempotency_key and (p.key_scope, p.idempotency_key) not in self.idempotency:
                idem_keys.add((p.key_scope, p.idempotency_key))
            if p.scope_id not in self.scopes:
                scope_ids.add(p.scope_id)
        for scope_id in await self.store.known_scopes(sorted(scope_ids)):
            self.scopes.put(scope_id, True)
        for key, head in (await self.store.load_heads(sorted(to_load))).items():
            self.heads.put(key, head)
        for key, record in (await self.store.load_idempotency(sorted(idem_keys))).items():
            self.idempotency.put(key, record)
        heads: dict[tuple[str, str], ObjectHead] = {}
        for p in parsed:
            for key in head_keys(p.command):
                cached = self.heads.get(key)
                if cached is not None:
                    heads[key] = cached
        heads.update(await self._forked_heads(parsed, heads))
        idem = {}
        for p in parsed:
            if p.idempotency_key:
                rec = self.idempotency.get((p.key_scope, p.idempotency_key))
                if rec is not None:
                    idem[(p.key_scope, p.idempotency_key)] = rec
        digests = [h.content_digest for p in parsed if isinstance(p.command, (TransitionState, Redact, CorrectProvenance))
                   for h in [heads.get((p.scope_id, p.command.object_id))] if h and h.content_digest]
        restorable = await self.store.load_restorable(sorted(
            (p.scope_id, p.command.object_id) for p in parsed if isinstance(p.command, TransitionState)
            and p.command.dimension == "availability" and p.command.target_state == "available"))
        digests.extend(restorable.values())
        policies, created_at = await self._retention_inputs(parsed)
        delegation_ids = sorted({d for p in parsed for d in [delegation_named(p.command)] if d})
        snapshots = [p.command for p in parsed if isinstance(p.command, CreateSnapshot)]
        forks = sorted({p.command.snapshot_id for p in parsed if isinstance(p.command, StartEvaluation)})
        for p in parsed:  # an evaluation scope is a scope the batch must know of (eval_start: taken or not)
            if isinstance(p.command, StartEvaluation) and p.command.evaluation_scope_id not in self.scopes:
                for scope_id in await self.store.known_scopes([p.command.evaluation_scope_id]):
                    self.scopes.put(scope_id, True)
        return PlanInputs(heads=heads, idempotency=idem, scope_known=self.scopes.__contains__,
                          stamp=new_stamp, tail=self.tail, registry=self.registry,
                          contents=await self.store.load_contents(digests), restorable=restorable,
                          scope_policies=policies, created_at=created_at,
                          delegations=await self.store.load_delegations(delegation_ids),
                          sealed=frozenset(await self.store.sealed_snapshots(sorted(
                              {s.snapshot.snapshot_id for s in snapshots}))),
                          born=await self.store.first_sequences(sorted(
                              {(s.scope_id, m) for s in snapshots for m in s.snapshot.included_object_ids or ()})),
                          runs=self.runs, snapshots=await self.store.snapshot_descriptors(forks),
                          authority=authority_of(self.policy), imports=await self._import_facts(parsed),
                          record_refusal=lambda item, exc: refusal_entry(self.denial_limiter, item, exc))

    async def _forked_heads(self, parsed: list[Parsed], heads: dict[tuple[str, str], ObjectHead]
                            ) -> dict[tuple[str, str], ObjectHead]:
        """Copy on write: for objects an evaluation run's commands name that its scope does not hold, the
        snapshot's version (core.evaluation.forked_head). Never cached: nothing of it is committed."""
        wanted: dict[str, list[str]] = {}
        for p in parsed:
            for key in head_keys(p.command):
                if key not in heads and key[0] in self.runs:
                    wanted.setdefault(key[0], []).append(key[1])
        found: dict[tuple[str, str], ObjectHead] = {}
        for scope_id, object_ids in sorted(wanted.items()):
            run = self.runs[scope_id]
            descriptor = (await self.store.snapshot_descriptors([run.snapshot_id])).get(run.snapshot_id)
            held = [o for o in sorted(set(object_ids)) if forkable(descriptor, o)]
            for object_id, base in (await self.store.load_heads_at(run.base_scope_id, held, run.watermark)).items():
                found[(scope_id, object_id)] = forked_head(base, run)
        return found

    async def _import_facts(self, parsed: list[Parsed]) -> dict[tuple[str, str], ImportFacts]:
        """For an import's chunks (nothing is read for batches without one): whether a first chunk's scope holds
        entries, whether a later chunk's previous one committed, which of their ids the ledger has."""
        chunks = [p.command for p in parsed if isinstance(p.command, ImportEntries)]
        if not chunks:
            return {}
        occupied, taken = await self.store.load_import_facts(
            sorted({c.scope_id for c in chunks if c.chunk == 0}), sorted({i for c in chunks for i in entry_ids(c)}))
        previous = await self.store.load_idempotency(sorted(
            {(c.scope_id, chunk_key(c.bundle_digest, c.chunk - 1)) for c in chunks if c.chunk > 0}))
        # A registration's record is keyed by its space id and holds its descriptor's digest (core.intake).
        registered = await self.store.load_idempotency(sorted({(SYSTEM_SCOPE, space_key(v.embedding_space_id))
                                                               for c in chunks for e in c.entries
                                                               for v in e.vectors or ()}))
        spaces = {r.idempotency_key.removeprefix(space_key("")): r.request_digest for r in registered.values()}
        return {(c.scope_id, chunk_key(c.bundle_digest, c.chunk)): ImportFacts(
            occupied=c.scope_id in occupied, taken=frozenset(taken), spaces=spaces,
            previous_committed=(c.scope_id, chunk_key(c.bundle_digest, c.chunk - 1)) in previous) for c in chunks}

    async def _retention_inputs(self, parsed: list[Parsed]) -> tuple[dict[str, Any], dict[tuple[str, str], Any]]:
        """For commands that may erase content or that set or carry a validation state: their scopes'
        policies (cached) and, where a policy sets a minimum retention, when the objects were created (nothing
        is read for batches without such commands)."""
        erasing = [p for p in parsed if erases_content(p.command)]
        policed = erasing + [p for p in parsed if needs_scope_policy(p.command)]
        if not policed:
            return {}, {}
        missing = sorted({p.scope_id for p in policed if p.scope_id not in self.scope_policies})
        for scope_id, policy in (await self.store.load_scope_policies(missing)).items():
            self.scope_policies.put(scope_id, policy)
        policies = {p.scope_id: self.scope_policies.get(p.scope_id) for p in policed}
        keys = sorted({(p.scope_id, str(getattr(p.command, "object_id"))) for p in erasing
                       if minimum_retention_days(policies.get(p.scope_id)) is not None})
        return policies, await self.store.load_created_at(keys)

    async def _journal_catch_up(self) -> None:
        """Journal what the ledger erased that the journal lacks (a writer that died between COMMIT and its
        journal write), then checkpoint at the head (an empty ledger's first: the journal vouches from its start)."""
        self.ledger_id = await self.store.identity()
        try:
            await catch_up(self.journal, self.store, self.ledger_id, self.store.partition, self.tail[0])
        except psycopg.Error:
            raise  # the database went away: the writer reconnects and tries again (lead_forever)
        except Exception:  # noqa: BLE001 - a journal that cannot be written or read must not keep the writer down
            log.exception("erasure_journal.catch_up_failed", path=str(self.journal.path))

    async def _journal(self, rows: list[LedgerRow]) -> None:
        """Record the batch's erasures (committed) and fsync. Any failure (the disk, the database asked for the
        ledger id) is logged and made up for at the next start (catch-up reads the ledger); the commit stands."""
        try:
            if self.ledger_id is None:
                self.ledger_id = await self.store.identity()
            self.journal.append(list(erasures_in(rows, self.ledger_id, self.store.partition)))
        except Exception:  # noqa: BLE001 - committed: the replies must go out whatever the journal's trouble
            log.exception("erasure_journal.write_failed", path=str(self.journal.path))

    def _advance(self, plan: Plan) -> None:
        self.tail = plan.tail
        for key, head in plan.heads.items():
            self.heads.put(key, head)
        for key, record in plan.idempotency.items():
            self.idempotency.put(key, record)
        if plan.batch.erase:  # the erasure forgot request digests in Postgres (store.ERASED_REQUEST): so do we
            self.idempotency.clear()
        for scope_id in plan.new_scopes:
            self.scopes.put(scope_id, True)
        self.runs.update(plan.runs)
        for scope_id, count in plan.written.items():
            run = self.runs.get(scope_id)
            if run is not None:
                self.runs[scope_id] = msgspec.structs.replace(run, entries=run.entries + count)

    async def _reply(self, msgs: list[Command], items: list[Parsed | PamledgerError], plan: Plan) -> None:
        replies: list[bytes | None] = []
        for msg, item, outcome in zip(msgs, items, plan.outcomes):
            try:
                body = await self._render(msg, item, outcome, replies)
            except Exception as exc:  # noqa: BLE001 - committed or not, this command's reply must not cost the others theirs
                name = msg.subject.rsplit(".", 1)[-1]
                known = known_result_bytes(outcome)
                if known is None:
                    body = error_body(exc, _op_id(msg, item), f"{name} reply")
                else:  # committed: answer what is known, and say that rendering failed
                    if isinstance(exc, (psycopg.OperationalError, psycopg.InterfaceError)):
                        # Postgres went away while a replay was read back: expected in an outage, no traceback
                        log.warning("reply.incomplete", command=name, committed=True, reason=type(exc).__name__)
                    else:
                        log.exception("reply.crashed", command=name, committed=True)
                    body = known
            replies.append(body)
            if msg.reply:
                await self.nc.publish(msg.reply, body)

    async def _render(self, msg: Command, item: Parsed | PamledgerError, outcome: Outcome,
                      replies: list[bytes | None]) -> bytes:
        """One command's reply body: its result, its error, a scope ack, or the replay of its first result."""
        if outcome.accepted is not None:
            a = outcome.accepted
            if a.parsed.refusal is not None:  # the refusal is recorded: now it may be answered
                return error_reply(a.parsed.refusal, (msg.headers or {}).get(OPERATION_HEADER) or a.parsed.operation_id)
            extra = {**(a.decision.result or {}), **a.written_through()}
            if a.decision.head is not None:
                return result_bytes(a.decision.head, a.ledger_sequence, a.decision.event.event_id, a.content,
                                    extra or None)
            if extra:  # a delegation's entry (its own result fields), an import chunk of event-only entries
                return canonical_bytes({"result": {"ledger_sequence": a.ledger_sequence,
                                                   "event_id": a.decision.event.event_id, **extra}})
            return entry_result_bytes(a.ledger_sequence, a.decision.event.event_id)
        if outcome.error is not None:
            return error_reply(outcome.error, _op_id(msg, item))
        if outcome.scope_result is not None:
            return canonical_bytes({"result": outcome.scope_result})
        if outcome.same_as is not None:
            return replies[outcome.same_as] or b""
        assert outcome.replay_of is not None
        return await fetch_replay(self.store.conn, outcome.replay_of, self.store.partition)

    async def _fail_all(self, msgs: list[Command], items: list[Any], error: PamledgerError) -> None:
        count_commands((_name(m), "rejected" if isinstance(i, PamledgerError) else "failed") for m, i in zip(msgs, items))
        for msg, item in zip(msgs, items):
            err = item if isinstance(item, PamledgerError) else error
            if msg.reply:
                await self.nc.publish(msg.reply, error_reply(err, _op_id(msg, item)))


class Command(NamedTuple):
    """One command as delivered: its subject names the command, `reply` is where its answer goes."""

    subject: str
    reply: str
    data: bytes
    headers: dict[str, str] | None


def _name(msg: Command) -> str:
    return msg.subject.rsplit(".", 1)[-1]


def _outcome(outcome: Outcome) -> str:
    """A command's outcome as a metric label (infra.metrics.COMMANDS_TOTAL)."""
    if outcome.accepted is not None:
        return "denied" if outcome.accepted.parsed.refusal is not None else "committed"
    if outcome.error is not None:
        return "rejected"
    if outcome.scope_result is not None:
        return "committed"
    return "replayed"  # an idempotent retry, or the same command twice in one batch


def _ledger_op_id(outcome: Outcome) -> str | None:
    """The operation id a committed command's ledger rows carry (the service assigns one when none was sent)."""
    return outcome.accepted.decision.event.operation_id if outcome.accepted is not None else None


def _op_id(msg: Command, item: Parsed | PamledgerError) -> str | None:
    if isinstance(item, Parsed) and item.operation_id:
        return item.operation_id
    return (msg.headers or {}).get(OPERATION_HEADER)


