"""Recording denials: an event-only `access_denied` ledger entry per refused request, rate-limited, failing closed.

Why rate-limited: a client that floods the service with refused requests must not flood the ledger. Each
(caller, rule) pair may record `burst` entries at once and one more every `every_seconds`; the ones it
may not are counted and the next entry it records says how many were left out (`suppressed`). Unauthenticated
callers share one key per rule, so forged ids cannot multiply the keys. The refused request is answered
`access_denied` either way.

Why failing closed: if an entry that should be recorded cannot be (the writer is away), the request answers
`service_unavailable` instead of `access_denied`: a denial the audit trail does not hold is not given out.
"""

from __future__ import annotations

import time
import uuid
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

import msgspec

from infra.requester import CommandRequester
from schemas.commands import Denial
from schemas.common import SYSTEM_SCOPE
from schemas.errors import PamledgerError, ServiceUnavailable

ANONYMOUS_ACTOR = {"actor_id": "actor:anonymous", "actor_kind": "anonymous"}


@dataclass
class _Bucket:
    tokens: float
    at: float
    suppressed: int = 0


class DenialLimiter:
    """Which denials to record. `admit` returns None (leave it out) or the number left out before it."""

    def __init__(self, burst: int = 5, every_seconds: float = 1.0, max_keys: int = 10_000):
        self.burst = burst
        self.every = every_seconds
        self.max_keys = max_keys
        self._buckets: OrderedDict[tuple[str, str], _Bucket] = OrderedDict()

    def admit(self, key: tuple[str, str], now: float | None = None) -> int | None:
        now = time.monotonic() if now is None else now
        bucket = self._buckets.get(key)
        if bucket is None:
            bucket = self._buckets[key] = _Bucket(tokens=float(self.burst), at=now)
            while len(self._buckets) > self.max_keys:  # forget the least recently seen caller
                self._buckets.popitem(last=False)
        self._buckets.move_to_end(key)
        bucket.tokens = min(float(self.burst), bucket.tokens + (now - bucket.at) / self.every)
        bucket.at = now
        if bucket.tokens < 1.0:
            bucket.suppressed += 1
            return None
        bucket.tokens -= 1.0
        left_out, bucket.suppressed = bucket.suppressed, 0
        return left_out

    def admit_entry(self, entry: dict[str, Any]) -> bool:
        """Whether to record this `record_access_denied` body; when so, it now says how many were left out."""
        denial = entry["denial"]
        suppressed = self.admit(limiter_key(entry["actor"] if denial.get("authenticated") else None,
                                            denial["rule_id"]))
        if suppressed is None:
            return False
        denial["suppressed"] = suppressed
        return True


def denial_entry(request: str, rule_id: str, code: str, scope_id: str | None, actor: dict[str, Any] | None,
                 token_id: str | None, claimed_actor_id: str | None) -> dict[str, Any]:
    """The `record_access_denied` command body for one denial (content-free by construction); the limiter
    (DenialLimiter.admit_entry) fills in how many like it it left out."""
    denial = Denial(request=request[:64], rule_id=rule_id, code=code,  # type: ignore[arg-type]
                    requested_scope_id=scope_id, authenticated=actor is not None, token_id=token_id,
                    claimed_actor_id=claimed_actor_id)
    return {"scope_id": SYSTEM_SCOPE, "actor": actor or ANONYMOUS_ACTOR, "denial": msgspec.to_builtins(denial),
            "operation_id": f"op:{uuid.uuid4()}"}


def limiter_key(actor: dict[str, Any] | None, rule_id: str) -> tuple[str, str]:
    return (actor["actor_id"] if actor else "", rule_id)


class DenialRecorder:
    """Sends denial entries to the writer for the query service and the gateway (the writer records its own
    in the batch that refuses the command)."""

    def __init__(self, requester: CommandRequester, limiter: DenialLimiter):
        self.requester = requester
        self.limiter = limiter

    async def record(self, entry: dict[str, Any]) -> None:
        """Record `entry` unless the limiter leaves it out; ServiceUnavailable when it cannot be recorded."""
        if not self.limiter.admit_entry(entry):
            return
        try:
            await self.requester.command("record_access_denied", entry)
        except PamledgerError as exc:
            raise ServiceUnavailable("the request is refused, but the refusal could not be recorded: retry",
                                     details={"reason": exc.code}) from None
        except Exception as exc:  # noqa: BLE001 - NATS away or timed out: fail closed all the same
            raise ServiceUnavailable("the request is refused, but the refusal could not be recorded: retry",
                                     details={"reason": type(exc).__name__}) from None
