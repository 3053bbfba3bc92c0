"""A Query at a past ledger sequence (as_of_sequence, a snapshot's watermark) answers the same rows whether it
reads the versions alone or the projection for the objects unchanged since (query.plan.temporal_sources):
the second is what the service uses once the projector has reached the sequence, the first is the definition.
Checked at every sequence of a scope's history with creates, updates, transitions, deletes, redactions and
objects of another scope interleaved, for each order, filters, full text, named members and a second page."""

from __future__ import annotations

from typing import Any

import msgspec
import psycopg

from pamledger_client.client import MemoryClient
from infra.projections import PROJECTION
from query.plan import build, sort_key
from schemas.queries import decode_query
from tests.conftest import ACTOR, PROVENANCE, Env, wait_for

SCOPE = "workspace:at-sequence"
OTHER = "workspace:at-sequence-other"
EVERY: dict[str, Any] = {
    "lifecycle_states": ["scratch", "candidate", "active", "superseded", "deprecated", "archived"],
    "validation_states": ["unverified", "corroborated", "disputed", "rejected"],
    "availability_states": ["available", "partially_redacted", "redacted", "deleted"],
}
REQUESTS: list[dict[str, Any]] = [
    {}, EVERY, {**EVERY, "order": "oldest"}, {**EVERY, "order": "committed_at_desc", "limit": 3},
    {**EVERY, "text": "cats", "order": "score"}, {**EVERY, "text": "mice"}, {**EVERY, "object_types": ["decision"]},
    {**EVERY, "limit": 2}, {**EVERY, "order": "valid_from_asc", "limit": 4},
]


async def _history(client: MemoryClient) -> None:
    """A scope whose objects change in every way a version can, with another scope's writes in between."""
    await client.create_scope(SCOPE)
    await client.create_scope(OTHER)
    made = [await client.create(SCOPE, "claim", {"statement": f"cats chase mice {i}"}, ACTOR, PROVENANCE)
            for i in range(6)]
    await client.create(OTHER, "claim", {"statement": "cats elsewhere"}, ACTOR, PROVENANCE)
    decision = await client.create(SCOPE, "decision", {"decision": "feed the cats", "rationale": "hungry"}, ACTOR,
                                   PROVENANCE)
    updated = await client.update(SCOPE, made[0]["object_id"], made[0]["version_id"],
                                  {"statement": "dogs chase cats"}, ACTOR, PROVENANCE)
    await client.update(SCOPE, made[0]["object_id"], updated["version_id"], {"statement": "mice hide"}, ACTOR,
                        PROVENANCE)
    await client.transition(SCOPE, made[1]["object_id"], made[1]["version_id"], "validation", "corroborated",
                            ACTOR, PROVENANCE)
    await client.delete(SCOPE, made[2]["object_id"], made[2]["version_id"], ACTOR, PROVENANCE)
    await client.redact(SCOPE, made[3]["object_id"], made[3]["version_id"], ACTOR, PROVENANCE, "policy:test")
    await client.create(OTHER, "claim", {"statement": "mice elsewhere"}, ACTOR, PROVENANCE)
    await client.update(SCOPE, decision["object_id"], decision["version_id"],
                        {"decision": "feed the cats twice", "rationale": "still hungry"}, ACTOR, PROVENANCE)
    await client.create(SCOPE, "claim", {"statement": "late cats"}, ACTOR, PROVENANCE)


def checkpoint_of(conn: psycopg.Connection[Any]) -> int:
    row = conn.execute("SELECT ledger_sequence FROM projection_checkpoints WHERE projection = %s",
                       (PROJECTION,)).fetchone()
    return int(row[0]) if row else 0


def _rows(conn: psycopg.Connection[Any], body: dict[str, Any], at: int, projected: bool,
          members: list[str] | None) -> list[Any]:
    request = decode_query(msgspec.json.encode({"scope_id": SCOPE, **body}))
    return conn.execute(*build(request, None, at, members, projected)).fetchall()


def _second_page(conn: psycopg.Connection[Any], body: dict[str, Any], at: int, projected: bool,
                 first: list[Any]) -> list[Any]:
    """The page after the first one's last row (the cursor's keyset values, as query.search takes them)."""
    request = decode_query(msgspec.json.encode({"scope_id": SCOPE, **body}))
    keys, _ = sort_key(request)
    last = first[request.limit - 1]
    after = list(last[2:2 + len(keys)])
    return conn.execute(*build(request, after, at, None, projected)).fetchall()


async def test_the_projection_and_the_versions_answer_the_same_rows_at_every_sequence(
        client: MemoryClient, service: Env) -> None:
    await _history(client)
    with psycopg.connect(service.database_url, autocommit=True) as conn:
        head = conn.execute("SELECT max(ledger_sequence) FROM ledger").fetchone()[0]
        await wait_for(lambda: checkpoint_of(conn) >= head)
        first = conn.execute("SELECT min(ledger_sequence) FROM ledger WHERE scope_id = %s", (SCOPE,)).fetchone()[0]
        ids = [r[0] for r in conn.execute("SELECT DISTINCT object_id FROM memory_versions WHERE scope_id = %s"
                                          " ORDER BY 1", (SCOPE,))]
        compared = pages = 0
        for at in range(first - 1, head + 1):
            for body in REQUESTS:
                for members in (None, ids[::2]):
                    slow = _rows(conn, body, at, False, members)
                    assert _rows(conn, body, at, True, members) == slow, (at, body, members)
                    compared += 1
                    limit = body.get("limit", 50)
                    if members is None and len(slow) > limit:
                        assert (_second_page(conn, body, at, True, slow)
                                == _second_page(conn, body, at, False, slow)), (at, body)
                        pages += 1
        assert compared > 200 and pages > 10  # the history is long enough to mean something
        # The sequences in the middle of the history see changed objects (the projection's rows are newer).
        middle = (first + head) // 2
        changed = conn.execute("SELECT count(*) FROM current_objects WHERE scope_id = %s AND ledger_sequence > %s",
                               (SCOPE, middle)).fetchone()[0]
        assert changed > 0 and _rows(conn, EVERY, middle, True, None)


async def test_at_sequence_zero_nothing_is_answered(client: MemoryClient, service: Env) -> None:
    with psycopg.connect(service.database_url, autocommit=True) as conn:
        for projected in (False, True):
            assert _rows(conn, EVERY, 0, projected, None) == []
