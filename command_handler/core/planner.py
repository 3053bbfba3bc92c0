"""Group commit planning: decide a batch of commands in order against head state, and lay out the rows.

The planner is the shell's bookkeeping around the pure core: it threads head state from one command to
the next inside a batch (so two updates of one object in one batch see each other), assigns ledger
sequences and hashes, and keeps replies in command order. It does no I/O apart from logging a command
whose handling raised something unexpected: that command alone answers internal_error, its batch-mates go on.
"""

from __future__ import annotations

from collections import ChainMap, Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Callable, get_args

import msgspec
import structlog

from command_handler.core.chain import row_hash
from command_handler.core.decide import decide
from command_handler.core.delegations import decide_delegation, exercise_for
from command_handler.core.intake import Parsed
from command_handler.core.idempotency import same_request
from command_handler.core.references import DELEGATION_COMMANDS
from command_handler.core.snapshots import seal
from command_handler.core.evaluation import EvaluationRun, ended, open_run, refuse_ended, run_record, run_stamp, \
    started
from command_handler.core.state import EVERYTHING, Authority, Context, Decision, ImportFacts, ObjectHead, Stamp
from command_handler.core.batch import Batch, ContentRow, RunRow, SnapshotRow, VersionRow
from infra.ledger import IdempotencyRow, LedgerRow
from schemas.canonical import canonical_bytes
from schemas.commands import CreateScope, EventOnlyCommand, ImportEntries, RecordAccessDenied
from schemas.delegation import CheckDelegation, DelegationState
from schemas.errors import AccessDenied, InvalidRequest, PamledgerError, ScopeNotFound
from schemas.evaluation import EVALUATION_SCOPE_KIND, EndEvaluation, StartEvaluation
from schemas.registry import TypeRegistry
from schemas.snapshots import CreateSnapshot

log = structlog.get_logger(__name__)



SERVICE_ENTRIES = get_args(EventOnlyCommand)  # event-only entries the service itself sends


@dataclass
class Accepted:
    """A command that will commit with the batch."""

    parsed: Parsed
    decision: Decision
    ledger_sequence: int
    content: bytes | None

    def written_through(self) -> dict[str, int]:
        """For a command of several entries (an import chunk, a promotion, a tool call's entry), the last
        ledger sequence it wrote (`through_sequence`: its entries are consecutive), so a client's
        read-your-writes waits for all of them and not only for its first entry's `ledger_sequence`."""
        followers = len(self.decision.followers)
        return {"through_sequence": self.ledger_sequence + followers} if followers else {}


@dataclass
class Outcome:
    """How one message is answered: an accepted command, an error, a replay or a scope ack."""

    accepted: Accepted | None = None
    error: PamledgerError | None = None
    replay_of: IdempotencyRow | None = None
    same_as: int | None = None  # index of an earlier accepted command in this batch (same key)
    scope_result: dict[str, Any] | None = None


@dataclass
class Plan:
    outcomes: list[Outcome]
    batch: Batch
    heads: dict[tuple[str, str], ObjectHead]
    idempotency: dict[tuple[str, str], IdempotencyRow]
    new_scopes: set[str]
    tail: tuple[int, bytes]
    delegations: dict[str, DelegationState] = field(default_factory=dict)  # states this batch changed
    runs: dict[str, EvaluationRun] = field(default_factory=dict)  # runs this batch started or ended, by scope
    written: Counter[str] = field(default_factory=Counter)  # this batch's ledger entries per scope


@dataclass
class PlanInputs:
    """What the planner may look at: state loaded for this batch, how to mint ids, and the type registry
    (object types, content schemas, transition tables) the core decides by."""

    heads: dict[tuple[str, str], ObjectHead]
    idempotency: dict[tuple[str, str], IdempotencyRow]
    scope_known: Callable[[str], bool]
    stamp: Callable[[Parsed], Stamp]
    tail: tuple[int, bytes]
    registry: TypeRegistry
    contents: dict[str, bytes] = field(default_factory=dict)  # by digest: transitions' replies, partial redactions
    restorable: dict[tuple[str, str], str] = field(default_factory=dict)  # suppressed content a restoration brings back
    scope_policies: dict[str, Any] = field(default_factory=dict)  # scopes of commands that may erase content
    created_at: dict[tuple[str, str], Any] = field(default_factory=dict)  # objects under a minimum retention
    delegations: dict[str, DelegationState] = field(default_factory=dict)  # loaded for this batch
    authority: Authority = EVERYTHING
    # By (scope_id, the chunk's idempotency key): what an import's chunk needs to know (core.imports)
    imports: dict[tuple[str, str], ImportFacts] = field(default_factory=dict)
    sealed: frozenset[str] = frozenset()  # snapshot ids this batch's snapshot_create commands name, already sealed
    born: dict[tuple[str, str], int] = field(default_factory=dict)  # their named members: first version's sequence
    runs: Mapping[str, EvaluationRun] = field(default_factory=dict)  # evaluation runs by their scope
    snapshots: dict[str, dict[str, Any]] = field(default_factory=dict)  # descriptors eval_start commands name
    # A refused delegation command -> the access_denied entry recording it (None: the limiter leaves it out).
    record_refusal: Callable[[Parsed, AccessDenied], Parsed | None] = lambda item, exc: None


def refused_before_key_check(items: list[Parsed | PamledgerError], plan: Plan,
                             looked_up: Callable[[tuple[str, str]], bool]) -> bool:
    """Whether a command carrying an idempotency key was refused while its key had not been looked up.

    Keys are checked optimistically (the store refuses a key seen before, and the batch is planned again
    with the records), but a retry that its own first commit made stale (an update's expected version, a
    create naming its object id) is refused by `decide` before anything reaches the store: without this
    check a writer that had not cached the record (after a restart, a takeover, an eviction, an erasure)
    would answer `version_conflict` where the original result is due."""
    return any(outcome.error is not None and isinstance(item, Parsed) and item.idempotency_key is not None
               and not looked_up((item.key_scope, item.idempotency_key))
               for item, outcome in zip(items, plan.outcomes, strict=True))


def plan_batch(items: list[Parsed | PamledgerError], inputs: PlanInputs) -> Plan:
    """Decide every item in order; rejected ones get their error and write nothing."""
    seq, prev = inputs.tail
    batch = Batch(ledger=[], versions=[], content=[], idempotency=[], erase=[], scopes=[])
    heads: dict[tuple[str, str], ObjectHead] = {}
    keys: dict[tuple[str, str], tuple[str, int | None]] = {}
    new_scopes: set[str] = set()
    outcomes: list[Outcome] = []
    delegations: dict[str, DelegationState] = {}
    sealed = set(inputs.sealed)  # snapshot ids sealed before this batch, then by it
    born: ChainMap[tuple[str, str], int] = ChainMap({}, inputs.born)  # objects' first sequences, this batch's too
    # Contents by digest: as loaded, then what this batch's own versions carry (a transition of an object the
    # batch created replies with its content; a partial redaction of it reads it).
    batch_contents: dict[str, bytes] = {}
    contents = ChainMap(batch_contents, inputs.contents)
    batch_runs: dict[str, EvaluationRun] = {}  # runs this batch started or ended, by scope
    runs: ChainMap[str, EvaluationRun] = ChainMap(batch_runs, dict(inputs.runs))
    written: Counter[str] = Counter()  # this batch's entries per scope (an evaluation run's index counts them)

    def context(batch_heads: dict[tuple[str, str], ObjectHead]) -> Context:
        """What a command may look at: heads as this batch left them, then as loaded; grants; contents."""
        return Context(heads=ChainMap(batch_heads, inputs.heads), authority=inputs.authority,
                       restorable=inputs.restorable, contents=contents,
                       scope_policies=inputs.scope_policies, created_at=inputs.created_at,
                       imports=_occupied(inputs.imports, batch) if inputs.imports else inputs.imports)

    for index, item in enumerate(items):
        if isinstance(item, PamledgerError):
            outcomes.append(Outcome(error=item))
            continue
        command = item.command
        # Everything that can fail for this one command happens inside the try, before anything of the
        # batch moves, so a command that fails (even unexpectedly) leaves no trace and its mates go on.
        try:
            if isinstance(command, CreateScope):
                outcomes.append(_create_scope(command, inputs, new_scopes, batch))
                continue
            creates_scope = not (command.scope_id in new_scopes or inputs.scope_known(command.scope_id))
            if creates_scope and not (isinstance(command, ImportEntries) and command.chunk == 0):
                raise ScopeNotFound("scope not found", details={"scope_id": command.scope_id})
            replay = _idempotent(item, inputs, keys)
            if replay is not None:
                outcomes.append(replay)
                continue
            run = _run_of(command, inputs, runs, new_scopes)
            stamp = _stamp(item, inputs, run, written)
            key = (command.scope_id, stamp.object_id)
            head = heads.get(key) or inputs.heads.get(key)
            exercise: tuple[Decision, DelegationState] | None = None
            # With auth off there is no policy to stand in for: a delegation named in an actor is only recorded.
            # The service's own entries (a subscription opened under a delegation: the gateway had the use
            # checked and counted already) exercise nothing here.
            check = None if isinstance(command, (*DELEGATION_COMMANDS, *SERVICE_ENTRIES, CreateSnapshot,
                                                 StartEvaluation, EndEvaluation)) \
                or inputs.authority is EVERYTHING else \
                exercise_for(command, head.meta if head is not None else None)  # type: ignore[arg-type]
            if isinstance(command, CreateSnapshot):
                decision = seal(command, stamp, seq, sealed, born)
            elif isinstance(command, StartEvaluation):
                assert run is not None
                decision = started(command, run, stamp, inputs.snapshots[command.snapshot_id])
            elif isinstance(command, EndEvaluation):
                if run is None:
                    raise InvalidRequest("this scope holds no evaluation run", details={"scope_id": command.scope_id})
                decision = ended(command, run, stamp, run.entries + written[command.scope_id])
            elif isinstance(command, DELEGATION_COMMANDS):
                if isinstance(command, CheckDelegation) and command.object_type is None and head is not None:
                    item = msgspec.structs.replace(item, command=msgspec.structs.replace(  # its type, from the head
                        command, object_type=head.meta.get("object_type")))
                item, command, decision, state = _delegation(item, stamp, inputs, delegations)
                if state is not None:
                    delegations[state.delegation_id] = state
            elif check is not None:  # made under a delegation: its use is checked first, in this batch
                checking = msgspec.structs.replace(item, name="check_delegation", command=check, idempotency_key=None)
                refused, _, used, state = _delegation(checking, _stamp(item, inputs, run, written, b"delegation"),
                                                      inputs, delegations)
                if state is None:  # refused: the refusal's entry is what this command writes
                    item, command, decision = refused, refused.command, used
                else:
                    item, command, decision = _decided(item, head, stamp, inputs, context(heads))
                    exercise = (msgspec.structs.replace(used, event=msgspec.structs.replace(
                        used.event, sequence=seq + 1)), state)
            else:
                item, command, decision = _decided(item, head, stamp, inputs, context(heads))
            entries = _sequenced(decision, seq + (1 if exercise is not None else 0))
        except PamledgerError as exc:
            outcomes.append(Outcome(error=exc))
            continue
        except Exception:  # noqa: BLE001 - a bug in one command's handling answers that command only
            log.exception("command.crashed", command=item.name, scope_id=command.scope_id)
            outcomes.append(Outcome(error=PamledgerError("internal error while handling the command")))
            continue
        before = len(batch.ledger)
        if exercise is not None:  # the delegation's use, just before the command it allowed
            used, state = exercise
            used_bytes = canonical_bytes(used.event)
            seq += 1
            new_hash = row_hash(prev, seq, used_bytes)
            _add_rows(batch, used, msgspec.structs.replace(item, idempotency_key=None), seq, (used_bytes, b""), prev,
                      new_hash, stamp)
            prev = new_hash
            delegations[state.delegation_id] = state
        if creates_scope and isinstance(command, ImportEntries):  # an import's first chunk makes its new scope
            new_scopes.add(command.scope_id)
            batch.scopes.append((command.scope_id, command.scope_kind, command.parent_scope_id,
                                 canonical_bytes(command.policy).decode() if command.policy is not None else None))
        first = seq + 1
        for position, (entry, encoded) in enumerate(entries):  # the command's own entry, then its followers
            seq += 1
            new_hash = row_hash(prev, seq, encoded[0])
            keyed = item if position == 0 else msgspec.structs.replace(item, idempotency_key=None)
            _add_rows(batch, entry, keyed, seq, encoded, prev, new_hash, stamp)
            prev = new_hash
            if entry.head is not None:
                heads[(entry.head.scope_id, entry.head.object_id)] = entry.head
                if entry.head.sequence == 1:
                    born[(entry.head.scope_id, entry.head.object_id)] = seq
                if entry.content is not None and entry.head.content_digest is not None:
                    batch_contents[entry.head.content_digest] = entry.content
        written.update(row.scope_id for row in batch.ledger[before:])
        decision = entries[0][0]
        if run is not None and isinstance(command, (StartEvaluation, EndEvaluation)):
            _record_run(command, run, first, runs, new_scopes, batch)
        if isinstance(command, CreateSnapshot) and decision.result is not None:
            sealed.add(command.snapshot.snapshot_id)
            batch.snapshots.append(SnapshotRow(snapshot_id=command.snapshot.snapshot_id, scope_id=command.scope_id,
                                               ledger_sequence=first,
                                               descriptor=canonical_bytes(decision.result["snapshot"])))
        if item.idempotency_key is not None:
            keys[(item.key_scope, item.idempotency_key)] = (item.request_digest, index)
        content = decision.content
        if content is None and decision.head is not None and decision.head.content_digest is not None:
            content = contents.get(decision.head.content_digest)
        outcomes.append(Outcome(accepted=Accepted(item, decision, first, content)))
    batch.delegations = list(delegations.values())
    return Plan(outcomes, batch, heads, _new_records(batch), new_scopes, (seq, prev), delegations, batch_runs,
                written)


def _run_of(command: Any, inputs: PlanInputs, runs: Mapping[str, EvaluationRun], new_scopes: set[str]
            ) -> EvaluationRun | None:
    """The evaluation run a command writes in (eval_start: the run it would open), or None; a write in an
    ended run's scope is refused."""
    if isinstance(command, StartEvaluation):
        scope_taken = command.evaluation_scope_id in new_scopes or inputs.scope_known(command.evaluation_scope_id)
        return open_run(command, inputs.snapshots.get(command.snapshot_id), scope_taken,
                        {r.run_id for r in runs.values()})
    run = runs.get(command.scope_id)
    if run is not None and not isinstance(command, EndEvaluation):
        refuse_ended(run)
    return run


def _stamp(item: Parsed, inputs: PlanInputs, run: EvaluationRun | None, written: Counter[str],
           purpose: bytes = b"") -> Stamp:
    """A command's ids and time: the system's, or in an evaluation run its clock's and seed's."""
    fresh = inputs.stamp(item)
    if run is None:
        return fresh
    index = 0 if isinstance(item.command, StartEvaluation) else run.entries + written[run.scope_id]
    return run_stamp(item, run, index, fresh, purpose)


def _record_run(command: StartEvaluation | EndEvaluation, run: EvaluationRun, sequence: int,
                runs: ChainMap[str, EvaluationRun], new_scopes: set[str], batch: Batch) -> None:
    """An accepted eval_start creates its scope and run row; an eval_end marks the run ended."""
    if isinstance(command, StartEvaluation):
        new_scopes.add(run.scope_id)
        batch.scopes.append((run.scope_id, EVALUATION_SCOPE_KIND, None, None))
        batch.runs.append(RunRow(scope_id=run.scope_id, evaluation_run_id=run.run_id, started_sequence=sequence,
                                 record=canonical_bytes(run_record(run))))
        runs[run.scope_id] = run
    else:
        fresh = [i for i, row in enumerate(batch.runs) if row.scope_id == run.scope_id]
        if fresh:  # started by this very batch: its row is inserted ended
            batch.runs[fresh[0]] = msgspec.structs.replace(batch.runs[fresh[0]], ended_sequence=sequence)
        else:
            batch.ended_runs.append((run.scope_id, sequence))
        runs[run.scope_id] = msgspec.structs.replace(run, ended=True)


def _occupied(loaded: dict[tuple[str, str], ImportFacts], batch: Batch) -> dict[tuple[str, str], ImportFacts]:
    """The import facts as loaded, but a scope this batch has already written entries into holds entries: a
    first chunk planned after them (another import's, a create) must see the scope occupied."""
    written = {row.scope_id for row in batch.ledger}
    return {key: msgspec.structs.replace(facts, occupied=True) if key[0] in written else facts
            for key, facts in loaded.items()}


def _sequenced(decision: Decision, seq: int) -> list[tuple[Decision, tuple[bytes, bytes]]]:
    """The command's entries in order (its own, then its followers), each encoded as (event bytes, meta
    bytes), with event-only entries' `sequence` set to the ledger sequence each will take after `seq`. All
    encoding happens here, before anything of the batch moves, so nothing later can fail halfway."""
    out = []
    for offset, entry in enumerate((decision, *decision.followers), start=1):
        if entry.head is None:
            entry = msgspec.structs.replace(entry, event=msgspec.structs.replace(entry.event, sequence=seq + offset))
        meta = canonical_bytes(entry.head.meta) if entry.head is not None else b""
        out.append((entry, (canonical_bytes(entry.event), meta)))
    return out


def _decided(item: Parsed, head: ObjectHead | None, stamp: Stamp, inputs: PlanInputs, context: Context
             ) -> tuple[Parsed, Any, Decision]:
    """The core's decision on a command; a refusal the core makes on authorization grounds (a cross-scope
    target, a policy override) becomes the access_denied entry that records it, like the policy's own."""
    try:
        return item, item.command, decide(head, item.command, stamp, inputs.registry, context)  # type: ignore[arg-type]
    except AccessDenied as exc:
        recorded = inputs.record_refusal(item, exc)
        if recorded is None:
            raise
        return recorded, recorded.command, decide(None, recorded.command, stamp, inputs.registry)  # type: ignore[arg-type]


def _delegation(item: Parsed, stamp: Stamp, inputs: PlanInputs, states: dict[str, DelegationState]
                ) -> tuple[Parsed, Any, Decision, DelegationState | None]:
    """Decide a delegation command against the delegation's state in this batch: its decision and the
    delegation's new state (the caller keeps it once the batch takes the entry). A refusal becomes the
    access_denied entry recording it (answered with the refusal; no state), or is raised when the limiter
    says so."""
    command = item.command
    assert isinstance(command, DELEGATION_COMMANDS)
    delegation_id = getattr(command, "delegation_id", None)
    state = (states.get(delegation_id) or inputs.delegations.get(delegation_id)) if delegation_id else None
    try:
        decision, new_state = decide_delegation(command, state, stamp, inputs.authority)
    except AccessDenied as exc:
        recorded = inputs.record_refusal(item, exc)
        if recorded is None:
            raise
        assert isinstance(recorded.command, RecordAccessDenied)
        return recorded, recorded.command, decide(None, recorded.command, stamp, inputs.registry), None
    return item, command, decision, new_state


def _idempotent(
    item: Parsed, inputs: PlanInputs, keys: dict[tuple[str, str], tuple[str, int | None]]
) -> Outcome | None:
    if item.idempotency_key is None:
        return None
    key = (item.key_scope, item.idempotency_key)
    earlier = keys.get(key)
    if earlier is not None:
        same_request(item, earlier[0])
        return Outcome(same_as=earlier[1])
    record = inputs.idempotency.get(key)
    if record is not None:
        same_request(item, record.request_digest)
        return Outcome(replay_of=record)
    return None


def _create_scope(
    command: CreateScope, inputs: PlanInputs, new_scopes: set[str], batch: Batch
) -> Outcome:
    created = not (command.scope_id in new_scopes or inputs.scope_known(command.scope_id))
    if created:
        policy = canonical_bytes(command.policy).decode() if command.policy is not None else None
        new_scopes.add(command.scope_id)
        batch.scopes.append((command.scope_id, command.scope_kind, command.parent_scope_id, policy))
    return Outcome(scope_result={"scope_id": command.scope_id, "created": created})


def _add_rows(
    batch: Batch, decision: Decision, item: Parsed, seq: int, encoded: tuple[bytes, bytes], prev: bytes,
    new_hash: bytes, stamp: Stamp,
) -> None:
    """Lay out one accepted command's rows; `encoded` is (event bytes, meta bytes), made by the caller so
    that nothing here can fail halfway."""
    event, head = decision.event, decision.head
    event_bytes, meta = encoded
    batch.ledger.append(LedgerRow(
        ledger_sequence=seq, event_id=event.event_id, operation_id=event.operation_id, scope_id=event.scope_id,
        object_id=event.object_id or event.relationship_id, version_id=event.version_id, event_type=event.event_type,
        recorded_at=event.recorded_at, event=event_bytes, prev_hash=prev, row_hash=new_hash,
    ))
    if head is None:  # an event-only entry: its record names no object or version, only its ledger row
        if item.idempotency_key is not None:
            batch.idempotency.append(IdempotencyRow(
                scope_id=event.scope_id, idempotency_key=item.idempotency_key, request_digest=item.request_digest,
                object_id=None, version_id=None, ledger_sequence=seq,
            ))
        return
    batch.versions.append(VersionRow(
        scope_id=head.scope_id, object_id=head.object_id, sequence=head.sequence, version_id=head.version_id,
        ledger_sequence=seq, meta=meta, content_digest=head.content_digest,
    ))
    if decision.content is not None and head.content_digest is not None:
        batch.content.append(ContentRow(
            content_digest=head.content_digest, scope_id=head.scope_id, object_id=head.object_id,
            salt=decision.salt or stamp.salt, content=decision.content,
        ))
    if decision.erase_content:
        batch.erase.append((head.scope_id, head.object_id, head.content_digest, seq))
    batch.handoff.extend(decision.handoff)
    if item.idempotency_key is not None:
        batch.idempotency.append(IdempotencyRow(
            scope_id=head.scope_id, idempotency_key=item.idempotency_key, request_digest=item.request_digest,
            object_id=head.object_id, version_id=head.version_id, ledger_sequence=seq,
        ))


def _new_records(batch: Batch) -> dict[tuple[str, str], IdempotencyRow]:
    return {(r.scope_id, r.idempotency_key): r for r in batch.idempotency}


def known_result_bytes(outcome: Outcome) -> bytes | None:
    """A committed command's result as far as it is known without rendering its envelope (None: the
    outcome committed nothing). Why: a reply that failed to render must not tell the client that a
    committed write failed; `reply_incomplete` says to re-send it with its idempotency key for the rest."""
    result: dict[str, Any]
    if outcome.accepted is not None:
        accepted, head = outcome.accepted, outcome.accepted.decision.head
        result = {"ledger_sequence": accepted.ledger_sequence, "event_id": accepted.decision.event.event_id,
                  **accepted.written_through()}
        if head is not None:
            result.update(object_id=head.object_id, version_id=head.version_id, sequence=head.sequence)
    elif outcome.replay_of is not None:
        record = outcome.replay_of
        result = {"ledger_sequence": record.ledger_sequence, "idempotency_result": "replayed_original_result"}
        if record.version_id is not None:
            result.update(object_id=record.object_id, version_id=record.version_id)
    else:
        return None
    return canonical_bytes({"result": {**result, "reply_incomplete": True}})
