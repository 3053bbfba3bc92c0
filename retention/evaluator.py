"""The retention evaluator's I/O: read the scopes' retention policies and the candidates from Postgres, plan
(retention.plan), send each proposal as a `transition` command over NATS, and count what became of it.

It reads the projection (current_objects): a stale row only costs a refused command, because every
transition names the version it was decided on. A version_conflict (the object moved meanwhile: a new
version, a legal hold placed) or an object deleted meanwhile is skipped and looked at again next round.
The system scope (actors, credentials) is never evaluated.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any, Protocol

import psycopg
import structlog

from authz.policy import RETENTION_ACTOR_ID
from infra.scopes import scopes_with_policy
from infra.settings import RetentionSettings
from retention.plan import Candidate, Proposal, ScopeRules, plan, scope_rules, tally, transition_command
from schemas.canonical import canonical_bytes
from schemas.common import SYSTEM_SCOPE
from schemas.errors import PamledgerError

log = structlog.get_logger(__name__)

RETENTION_ACTOR: Mapping[str, str] = {"actor_id": RETENTION_ACTOR_ID, "actor_kind": "service"}
# Refusals that mean "the object moved since it was read": not a failure, the next round looks again.
SKIPPED = frozenset({"version_conflict", "object_deleted", "object_not_found"})

# An object once expired and brought back to retained (a person's decision) is never proposed again.
# An object's age is its first version's commit (its ledger row's recorded_at). The candidates are found by
# two index-friendly halves (a partial index on valid_until of retained objects, migration 014; and the objects
# of the scopes whose policy sets a cutoff), and only they are joined to their first version's ledger row. That
# row is in its scope's partition (recorded on the scope, infra.partitions): the ledger's key is (partition,
# sequence), so one probe finds it, whatever the partition count. Every scope is evaluated, in every partition.
CANDIDATES_SQL = """
WITH cutoffs AS (SELECT * FROM json_to_recordset(%(cutoffs)s::json) AS c(scope_id text, cutoff timestamptz)),
candidates AS (
  SELECT o.scope_id, o.object_id FROM current_objects o
  WHERE o.retention_state = 'retained' AND o.valid_until < %(now)s
    AND o.scope_id <> %(system)s AND (%(scope)s::text IS NULL OR o.scope_id = %(scope)s)
  UNION
  SELECT o.scope_id, o.object_id FROM cutoffs c
  JOIN current_objects o ON o.scope_id = c.scope_id AND o.retention_state = 'retained'
  JOIN memory_versions v ON v.scope_id = o.scope_id AND v.object_id = o.object_id AND v.sequence = 1
  JOIN scopes s ON s.scope_id = v.scope_id
  JOIN ledger l ON l.partition = s.partition AND l.ledger_sequence = v.ledger_sequence
  WHERE l.recorded_at < c.cutoff AND o.scope_id <> %(system)s AND (%(scope)s::text IS NULL OR o.scope_id = %(scope)s)
)
SELECT o.scope_id, o.object_id, o.version_id, o.retention_state, o.availability_state, o.valid_until,
       l.recorded_at
FROM candidates k
JOIN current_objects o ON o.scope_id = k.scope_id AND o.object_id = k.object_id
JOIN memory_versions v ON v.scope_id = o.scope_id AND v.object_id = o.object_id AND v.sequence = 1
JOIN scopes s ON s.scope_id = v.scope_id
JOIN ledger l ON l.partition = s.partition AND l.ledger_sequence = v.ledger_sequence
WHERE o.availability_state <> 'deleted'
  AND NOT EXISTS (SELECT 1 FROM memory_versions w WHERE w.scope_id = o.scope_id AND w.object_id = o.object_id
                  AND convert_from(w.meta, 'UTF8')::jsonb ->> 'retention_state' = 'expired')
ORDER BY o.scope_id, o.object_id
LIMIT %(limit)s"""


class Requester(Protocol):
    """Sends a writer command by name (infra.requester.CommandRequester)."""

    async def command(self, name: str, body: dict[str, Any]) -> dict[str, Any]: ...


@dataclass
class Round:
    """One evaluation: what it proposed and, unless a dry run, what became of each proposal."""

    now: datetime
    dry_run: bool
    proposals: list[Proposal]
    problems: tuple[dict[str, str], ...]
    expired: int = 0
    skipped: dict[str, int] = field(default_factory=dict)
    failed: dict[str, int] = field(default_factory=dict)

    def counts(self) -> dict[str, Any]:
        sent = {} if self.dry_run else {"expired": self.expired, "skipped": self.skipped, "failed": self.failed}
        return {"dry_run": self.dry_run, "now": self.now.isoformat(), "proposed": len(self.proposals),
                "by_rule": tally(self.proposals), "policy_problems": len(self.problems), **sent}

    def report(self) -> dict[str, Any]:
        return {**self.counts(), "problems": list(self.problems), "proposals": [p.as_json() for p in self.proposals]}


async def read_plan(conn: psycopg.AsyncConnection[Any], now: datetime, scope_id: str | None = None,
                    limit: int = 10_000) -> tuple[list[Proposal], ScopeRules]:
    """The proposals as of `now` (at most `limit`) over every scope of every partition (one leader evaluates
    them all), and the scope rules they were made with."""
    params: dict[str, Any] = {"system": SYSTEM_SCOPE, "scope": scope_id}
    rules = scope_rules(await scopes_with_policy(conn, "retention", SYSTEM_SCOPE, scope_id))
    cutoffs = [{"scope_id": s, "cutoff": c.isoformat()} for s, c in rules.cutoffs(now).items()]
    params.update(cutoffs=canonical_bytes(cutoffs).decode(), now=now, limit=limit)
    rows = await (await conn.execute(CANDIDATES_SQL, params)).fetchall()
    candidates = [Candidate(*row) for row in rows]
    return plan(candidates, rules, now), rules


IN_FLIGHT = 64  # proposals sent at once: they wait in the writer's inbox together, so one commit serves many


async def send(requester: Requester, proposals: list[Proposal], evaluation: Round) -> None:
    """Each proposal as a transition command, IN_FLIGHT at a time (sent one by one, every expiration would be a
    commit of its own). service_unavailable (the writer away past the requester's retries) ends the round: it
    raises, once the commands in flight have been answered."""
    gate = asyncio.Semaphore(IN_FLIGHT)

    async def one(proposal: Proposal) -> None:
        async with gate:
            try:
                await requester.command("transition", transition_command(proposal, RETENTION_ACTOR))
            except PamledgerError as exc:
                if exc.code == "service_unavailable":
                    raise
                bucket = evaluation.skipped if exc.code in SKIPPED else evaluation.failed
                bucket[exc.code] = bucket.get(exc.code, 0) + 1
                if bucket is evaluation.failed:
                    log.warning("retention.refused", scope_id=proposal.scope_id, object_id=proposal.object_id,
                                code=exc.code, rule_id=getattr(exc, "rule_id", None))
            else:
                evaluation.expired += 1

    results = await asyncio.gather(*(one(p) for p in proposals), return_exceptions=True)
    for result in results:
        if isinstance(result, BaseException):
            raise result


async def evaluate(conn: psycopg.AsyncConnection[Any], requester: Requester | None, now: datetime,
                   scope_id: str | None = None, limit: int = 10_000) -> Round:
    """One round: plan, then send unless `requester` is None (a dry run, which writes nothing)."""
    proposals, rules = await read_plan(conn, now, scope_id, limit)
    evaluation = Round(now, requester is None, proposals, rules.problems)
    if requester is not None:
        await send(requester, proposals, evaluation)
    return evaluation


async def run_rounds(conn: psycopg.AsyncConnection[Any], requester: Requester, settings: RetentionSettings,
                     last: dict[str, Any]) -> None:
    """The role: a round now, then one every `every_seconds`, forever; `last` holds the last round's counts
    (the role's status). Failures propagate to the role loop, which backs off and comes back."""
    while True:
        evaluation = await evaluate(conn, requester, datetime.now(timezone.utc),
                                    limit=settings.max_per_round)
        last.clear()
        last.update(evaluation.counts())
        log.info("retention.evaluated", proposed=len(evaluation.proposals), expired=evaluation.expired,
                 skipped=sum(evaluation.skipped.values()), failed=sum(evaluation.failed.values()),
                 policy_problems=len(evaluation.problems))
        await asyncio.sleep(settings.every_seconds)
