"""The ledger's identity, and the checks that the stream, checkpoints and subscription positions are its own.

Why: a database re-created (or restored from an older backup) beside a surviving JetStream stream and
checkpoint once left the relay and the projector following a stream far ahead of the new ledger, so new
writes never reached readers. Every role that follows the ledger checks, before it starts, that what it
follows carries this ledger's id and is not ahead of the ledger head; while they disagree it waits (logging
one line per change of reason) for the operator's explicit recovery command, then goes on by itself.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

import msgspec
import nats
import psycopg
import structlog
from nats.js import JetStreamContext
from nats.js.errors import NotFoundError

from infra.ledger import ledger_head
from pamledger_client.protocol.tasks import reraise_if_cancelled

log = structlog.get_logger(__name__)
STREAM_KEY = "pamledger_ledger_id"  # the stream's metadata key that names its ledger
REBUILD_STREAM = "pamledger stream rebuild"
REBUILD_PROJECTION = "pamledger replay --swap"
RETRY_SECONDS = 2.0
# The partition's ledger id as an SQL expression (one parameter: the partition; NULL before it has one).
IDENTITY = "(SELECT ledger_id FROM ledger_identity WHERE partition = %s)"


class Disagreement(msgspec.Struct, frozen=True, kw_only=True):
    """Why a role refuses to follow: what disagrees with the ledger, both identities, and the way out."""

    what: str  # "stream", "checkpoint" or "subscriptions"
    problem: str
    ledger_id: str
    found_ledger_id: str | None
    ledger_head: int
    found_sequence: int
    recovery: str

    def message(self) -> str:
        return (f"the {self.what} {self.problem}: ledger {self.ledger_id} (head {self.ledger_head}), "
                f"{self.what} of ledger {self.found_ledger_id or 'unknown'} at {self.found_sequence};"
                f" recover with `{self.recovery}`")


async def ledger_identity(conn: psycopg.AsyncConnection[Any], partition: int) -> str:
    """This ledger's id, made now if it has none yet (the first role to ask makes it; concurrent askers
    agree, as the insert does nothing when another one won)."""
    await conn.execute("INSERT INTO ledger_identity (partition, ledger_id) VALUES (%s, %s)"
                       " ON CONFLICT (partition) DO NOTHING", (partition, f"ledger:{uuid.uuid4()}"))
    row = await (await conn.execute(f"SELECT {IDENTITY}", (partition,))).fetchone()
    assert row is not None and row[0] is not None
    return str(row[0])


def stream_ledger_id(info: Any) -> str | None:
    """The ledger id a stream was made for (None: a stream made before identities existed)."""
    metadata = info.config.metadata or {}
    return metadata.get(STREAM_KEY)


async def _stream_state(conn: psycopg.AsyncConnection[Any], js: JetStreamContext, stream: str,
                        partition: int) -> tuple[str, Any, int, int, str | None] | None:
    """This ledger's id, the stream's info, the ledger head, the stream's last sequence and the ledger id the
    stream names (None: there is no stream yet)."""
    ledger_id = await ledger_identity(conn, partition)
    try:
        info = await js.stream_info(stream)
    except NotFoundError:
        return None
    return ledger_id, info, await ledger_head(conn, partition), int(info.state.last_seq), stream_ledger_id(info)


async def stream_disagreement(conn: psycopg.AsyncConnection[Any], js: JetStreamContext, stream: str,
                              partition: int) -> Disagreement | None:
    """None when the stream is missing (the relay makes it) or is this ledger's and not ahead of it. A
    stream made before identities is adopted (stamped) when its last message is this ledger's event."""
    state = await _stream_state(conn, js, stream, partition)
    if state is None:
        return None
    ledger_id, info, head, last, found = state

    def refuse(problem: str) -> Disagreement:
        return Disagreement(what="stream", problem=problem, ledger_id=ledger_id, found_ledger_id=found,
                            ledger_head=head, found_sequence=last, recovery=REBUILD_STREAM)

    if found is not None and found != ledger_id:
        return refuse("belongs to another ledger")
    if last > head:
        return refuse("is ahead of the ledger")
    if last and not await same_event(conn, js, stream, partition, last):
        return refuse("holds events that are not this ledger's" if found is None
                      else f"holds another event than the ledger at sequence {last}")
    if found is None:
        await stamp_stream(js, info, ledger_id)
    return None


async def same_event(conn: psycopg.AsyncConnection[Any], js: JetStreamContext, stream: str, partition: int,
                     sequence: int) -> bool:
    """Whether the stream's message at `sequence` is the ledger's row there (its event id and, when the
    message carries one, its row hash)."""
    try:
        msg = await js.get_msg(stream, sequence)
    except NotFoundError:
        return False
    headers = msg.headers or {}
    cur = await conn.execute("SELECT event_id, row_hash FROM ledger WHERE partition = %s AND ledger_sequence = %s",
                             (partition, sequence))
    row = await cur.fetchone()
    return row is not None and headers.get("Nats-Msg-Id") == row[0] and (
        headers.get("Pam-Row-Hash") in (None, bytes(row[1]).hex()))


async def stream_reuse(conn: psycopg.AsyncConnection[Any], js: JetStreamContext, stream: str,
                       partition: int) -> Disagreement | None:
    """Why appending now would reuse sequences readers already saw (None: it would not): this ledger's
    stream is ahead of the ledger head, or holds another event at its last sequence. A stream stamped for
    another ledger is another sequence space (the relay refuses it; appending reuses nothing of it); one
    made before identities counts as this ledger's when its message at the ledger head is the ledger's."""
    state = await _stream_state(conn, js, stream, partition)
    if state is None:
        return None
    ledger_id, _, head, last, found = state
    if found not in (None, ledger_id) or not last:
        return None
    if found is None and not (head and await same_event(conn, js, stream, partition, min(head, last))):
        return None
    if last > head:
        problem = "is ahead of the ledger"
    elif not await same_event(conn, js, stream, partition, last):
        problem = f"holds another event than the ledger at sequence {last}"
    else:
        return None
    return Disagreement(what="stream", problem=problem, ledger_id=ledger_id, found_ledger_id=found,
                        ledger_head=head, found_sequence=last, recovery=f"{REBUILD_STREAM} --force")


async def stream_discards(conn: psycopg.AsyncConnection[Any], js: JetStreamContext, stream: str, partition: int,
                          limit: int = 1000) -> list[dict[str, Any]]:
    """The stream's messages that are not the ledger's rows (past its head, or other events at the same
    sequences), oldest first, from the newest back to the first that agrees (at most `limit`): what a
    rebuild throws away."""
    info = await js.stream_info(stream)
    head = await ledger_head(conn, partition)
    found: list[dict[str, Any]] = []
    sequence = int(info.state.last_seq)
    while sequence > 0 and len(found) < limit:
        if sequence <= head and await same_event(conn, js, stream, partition, sequence):
            break
        try:
            msg = await js.get_msg(stream, sequence)
            event_id = (msg.headers or {}).get("Nats-Msg-Id")
        except NotFoundError:
            event_id = None
        found.append({"sequence": sequence, "event_id": event_id})
        sequence -= 1
    return found[::-1]


async def stamp_stream(js: JetStreamContext, info: Any, ledger_id: str) -> None:
    """Name the ledger in the stream's metadata and description."""
    metadata = {**(info.config.metadata or {}), STREAM_KEY: ledger_id}
    await js.update_stream(info.config.evolve(metadata=metadata, description=stream_description(ledger_id)))
    log.info("stream.stamped", stream=info.config.name, ledger_id=ledger_id)


def stream_description(ledger_id: str) -> str:
    return f"pamledger replica of ledger {ledger_id}"


async def checkpoint_disagreement(conn: psycopg.AsyncConnection[Any], projection: str,
                                  partition: int, recovery: str = REBUILD_PROJECTION) -> Disagreement | None:
    """None when the projection's checkpoint is this ledger's and not ahead of it (a checkpoint made before
    identities is stamped when it is not ahead)."""
    ledger_id = await ledger_identity(conn, partition)
    cur = await conn.execute("SELECT ledger_sequence, ledger_id FROM projection_checkpoints WHERE projection = %s",
                             (projection,))
    row = await cur.fetchone()
    if row is None:
        return None
    sequence, found = int(row[0]), row[1]
    head = await ledger_head(conn, partition)
    problem = ("belongs to another ledger" if found is not None and found != ledger_id
               else "is ahead of the ledger" if sequence > head else None)
    if problem:
        return Disagreement(what="checkpoint", problem=problem, ledger_id=ledger_id, found_ledger_id=found,
                            ledger_head=head, found_sequence=sequence, recovery=recovery)
    if found is None:
        await conn.execute("UPDATE projection_checkpoints SET ledger_id = %s WHERE projection = %s",
                           (ledger_id, projection))
    return None


async def follower_disagreement(conn: psycopg.AsyncConnection[Any], js: JetStreamContext, stream: str,
                                checkpoint_name: str, partition: int,
                                recovery: str = REBUILD_PROJECTION) -> Disagreement | None:
    """What a follower of the stream checks before it follows: the stream, then its checkpoint (`recovery`:
    the follower's own way back when its checkpoint is another ledger's or ahead of this one)."""
    return (await stream_disagreement(conn, js, stream, partition)
            or await checkpoint_disagreement(conn, checkpoint_name, partition, recovery))


class Refusal:
    """A role's current reason to refuse (None: it agrees), for its status reply."""

    def __init__(self) -> None:
        self.reason: Disagreement | None = None


async def wait_for_agreement(role: str, check: Callable[[], Awaitable[Disagreement | None]],
                             refusal: Refusal | None = None, retry_seconds: float = RETRY_SECONDS) -> None:
    """Return once `check` finds nothing to disagree with; until then retry, logging one line each time
    the reason changes (no traceback: it is the operator's move, not a bug). A check that cannot run (NATS
    away) is said once when it starts and once when it ends, not once per retry or per kind of error: an
    outage's log does not grow with its length."""
    refusal = refusal or Refusal()
    failing: set[str] = set()  # the kinds of error the check failed with since it last ran
    while True:
        try:
            reason = await check()
        except (nats.errors.Error, asyncio.TimeoutError) as exc:
            reraise_if_cancelled()
            error = type(exc).__name__
            # One state, "the check cannot run": said when it starts; the kinds of error seen meanwhile are
            # named when it ends (an outage alternates between them, which is no change of state).
            (log.debug if failing else log.warning)(f"{role}.identity_check_failed", error=error)
            failing.add(error)
            await asyncio.sleep(retry_seconds)
            continue
        if failing:
            log.info(f"{role}.identity_checked", after_errors=sorted(failing))
            failing.clear()
        if reason is None:
            if refusal.reason is not None:
                log.info(f"{role}.ledger_agreed")
            refusal.reason = None
            return
        if reason != refusal.reason:
            log.error(f"{role}.refused", reason=reason.message(), what=reason.what, ledger_id=reason.ledger_id,
                      found_ledger_id=reason.found_ledger_id, ledger_head=reason.ledger_head,
                      found_sequence=reason.found_sequence, recovery=reason.recovery)
        refusal.reason = reason
        await asyncio.sleep(retry_seconds)
