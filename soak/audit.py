"""The audit after the soak's quiet period: each check's name -> the problems it found (none: it passed).

Checks: every acknowledged write reads back at its version; the ledger is gapless; `pamledger verify` (hash
chain, stream == ledger) and `pamledger replay --verify` (a rebuild equals the projection) exit 0; each
subscription handed out exactly the ledger's matching events of its scope after its start, once, in order; no
erased canary word is in any textual column of any table, nor in any message of the stream.
"""

from __future__ import annotations

import asyncio
import json
import psycopg
from psycopg import sql

from embedding.store import INDEX_CHECKPOINT, find_space
from infra.projections import checkpoint
from infra.settings import Settings
from pamledger_client.client import MemoryClient
from pamledger.runtime import connect_nats
from soak.load import Acked, Record, Watched, code_of
from soak.service import Service

TEXTUAL = ("text", "character varying", "character", "name", "bytea", "json", "jsonb", "tsvector", "xml")
SHOWN = 5  # problems listed per check (the count is always complete)


async def caught_up(database_url: str) -> bool:
    """Projector and indexer have applied the whole ledger, the indexer's outbox is empty."""
    async with await psycopg.AsyncConnection.connect(database_url, autocommit=True, connect_timeout=5) as conn:
        head = (await (await conn.execute("SELECT coalesce(max(ledger_sequence), 0) FROM ledger")).fetchone()
                or (0,))[0]
        outbox = (await (await conn.execute("SELECT count(*) FROM index_outbox")).fetchone() or (0,))[0]
        default = await find_space(conn, None)
        return bool(outbox == 0 and default is not None and default.state == "ready"
                    and await checkpoint(conn) >= head and await checkpoint(conn, INDEX_CHECKPOINT) >= head)


async def expected_events(database_url: str, watched: Watched) -> list[int]:
    """The ledger sequences `watched` should have handed out: its scope's events after its start (of its
    event classes, when it names some)."""
    classes = watched.filter.get("event_classes")
    async with await psycopg.AsyncConnection.connect(database_url, autocommit=True) as conn:
        cur = await conn.execute(
            "SELECT ledger_sequence FROM ledger WHERE scope_id = %s AND ledger_sequence > %s"
            " AND (%s::text[] IS NULL OR event_type = ANY(%s::text[])) ORDER BY ledger_sequence",
            (watched.scope_id, watched.start_sequence, classes, classes))
        return [int(row[0]) for row in await cur.fetchall()]


def delivery_problems(watched: Watched, expected: list[int]) -> list[str]:
    """What differs between what a subscription handed out and what it should have."""
    if watched.open_failed or not watched.subscription_id:
        return [f"{watched.scope_id} {watched.filter}: never opened"]
    got = watched.received
    problems = []
    if len(set(got)) != len(got):
        problems.append(f"{watched.subscription_id}: {len(got) - len(set(got))} event(s) handed out twice")
    if got != sorted(got):
        problems.append(f"{watched.subscription_id}: out of order")
    missing, extra = sorted(set(expected) - set(got)), sorted(set(got) - set(expected))
    if missing:
        problems.append(f"{watched.subscription_id}: {len(missing)} event(s) missing, first {missing[:SHOWN]}")
    if extra:
        problems.append(f"{watched.subscription_id}: {len(extra)} event(s) it should not have, first {extra[:SHOWN]}")
    return problems


async def unreadable(client: MemoryClient, record: Record) -> list[str]:
    """Each acknowledged write read back at its version. An erased object answers object_redacted to a read
    (PAMSPEC 10.9): its acknowledged versions must then be in its history."""
    erased = set(record.canaries.values())
    problems = []
    for acked in record.acked:
        try:
            envelope = await client.read(acked.scope_id, acked.object_id, acked.version_id)
        except Exception as exc:  # noqa: BLE001 - any other failure is a lost acknowledged write
            if acked.object_id in erased and code_of(exc) == "object_redacted":
                if not await in_history(client, acked):
                    problems.append(f"{acked.kind} {acked.object_id}@{acked.version_id}: not in its history")
                continue
            problems.append(f"{acked.kind} {acked.object_id}@{acked.version_id}: {code_of(exc)}")
            continue
        if envelope.get("version_id") != acked.version_id:
            problems.append(f"{acked.kind} {acked.object_id}: read {envelope.get('version_id')} for {acked.version_id}")
    return problems


async def in_history(client: MemoryClient, acked: Acked) -> bool:
    try:
        history = await client.history(acked.scope_id, acked.object_id)
    except Exception:  # noqa: BLE001 - no history: not readable
        return False
    return acked.version_id in json.dumps(history)


async def gateway_view(client: MemoryClient, subscription_id: str) -> str:
    """What the gateway's `sub.status` answers for one subscription (for the report of a failed delivery)."""
    try:
        return json.dumps(await client.subscription_request("status", {"subscription_id": subscription_id}))
    except Exception as exc:  # noqa: BLE001 - its error is the answer
        return code_of(exc)


async def ledger_gaps(database_url: str) -> list[str]:
    async with await psycopg.AsyncConnection.connect(database_url, autocommit=True) as conn:
        cur = await conn.execute("SELECT partition, count(*), min(ledger_sequence), max(ledger_sequence)"
                                 " FROM ledger GROUP BY partition")
        return [f"partition {p}: {n} rows from {lo} to {hi}" for p, n, lo, hi in await cur.fetchall()
                if lo != 1 or hi != n]


async def canaries_in_database(database_url: str, canaries: dict[str, str]) -> list[str]:
    """Every textual column of every table (and materialized view) of every schema holding an erased word."""
    if not canaries:
        return []
    words = list(canaries)
    found = []
    async with await psycopg.AsyncConnection.connect(database_url, autocommit=True) as conn:
        columns = await (await conn.execute(
            "SELECT n.nspname, c.relname, a.attname, format_type(a.atttypid, NULL), t.typcategory"
            " FROM pg_attribute a JOIN pg_class c ON c.oid = a.attrelid JOIN pg_namespace n ON n.oid = c.relnamespace"
            " JOIN pg_type t ON t.oid = a.atttypid"
            " WHERE c.relkind IN ('r', 'm', 'p') AND a.attnum > 0 AND NOT a.attisdropped"
            " AND n.nspname NOT IN ('pg_catalog', 'information_schema') AND n.nspname NOT LIKE 'pg\\_toast%%'"
            " AND n.nspname NOT LIKE 'pg\\_temp%%'")).fetchall()
        for schema, table, column, kind, category in columns:
            if kind.rstrip("[]") not in TEXTUAL and category != "A":
                continue
            target = sql.SQL("t.{}").format(sql.Identifier(column))
            test = (sql.SQL("position(convert_to(w, 'UTF8') in {}) > 0").format(target) if kind == "bytea"
                    else sql.SQL("strpos({}::text, w) > 0").format(target))
            hits = await conn.execute(sql.SQL(
                "SELECT w FROM unnest(%s::text[]) AS w WHERE EXISTS (SELECT 1 FROM {}.{} t WHERE {})").format(
                    sql.Identifier(schema), sql.Identifier(table), test), (words,))
            found += [f"{schema}.{table}.{column}: {w} (object {canaries[w]})" for (w,) in await hits.fetchall()]
    return found


async def canaries_in_stream(service: Service, canaries: dict[str, str]) -> list[str]:
    """Every message of the ledger's stream (data and headers) holding an erased word (read as the service
    user of the state dir: the stream is not the administrator's to read)."""
    if not canaries:
        return []
    settings = Settings(state_dir=service.state)
    stream = settings.stream_name
    nc = await connect_nats((service.servers() or {})["nats_url"], "soak-audit", settings)
    found = []
    try:
        js = nc.jetstream()
        info = await js.stream_info(stream)
        for seq in range(info.state.first_seq, info.state.last_seq + 1):
            msg = await js.get_msg(stream, seq)
            blob = (msg.data or b"") + json.dumps(msg.headers or {}).encode()
            found += [f"stream message {seq}: {w}" for w in canaries if w.encode() in blob]
    finally:
        await nc.close()
    return found


def cli_check(service: Service, *args: str) -> list[str]:
    """`pamledger ARGS` exits 0, else its last lines."""
    done = service.cli(*args)
    if done.returncode == 0:
        return []
    tail = (done.stdout + done.stderr).strip().splitlines()[-SHOWN:]
    return [f"pamledger {' '.join(args)} exited {done.returncode}: " + " | ".join(tail)]


async def run_audit(service: Service, client: MemoryClient, record: Record) -> dict[str, list[str]]:
    servers = service.servers() or {}
    database_url = servers["database_url"]
    checks: dict[str, list[str]] = {}
    checks["acknowledged writes readable"] = await unreadable(client, record)
    checks["ledger gapless"] = await ledger_gaps(database_url)
    checks["pamledger verify"] = await asyncio.to_thread(cli_check, service, "verify")
    checks["pamledger replay --verify"] = await asyncio.to_thread(cli_check, service, "replay", "--verify")
    delivered: list[str] = []
    for watched in record.watched:
        problems = delivery_problems(watched, await expected_events(database_url, watched))
        if problems and watched.subscription_id:
            problems.append(f"{watched.subscription_id} ({watched.scope_id}): the gateway says "
                            + await gateway_view(client, watched.subscription_id))
        delivered += problems
    checks["subscriptions exactly once, in order"] = delivered
    checks["no erased canary in any table"] = await canaries_in_database(database_url, record.canaries)
    checks["no erased canary in the stream"] = await canaries_in_stream(service, record.canaries)
    return checks


def subscriptions_caught_up(record: Record, expected: dict[int, list[int]]) -> bool:
    return all(not want or (w.received and w.received[-1] >= want[-1]) for i, w in enumerate(record.watched)
               for want in [expected.get(i, [])])


async def wait_quiet(service: Service, record: Record, timeout: float) -> bool:
    """Followers caught up with the ledger and every subscription with its scope's last matching event."""
    database_url = (service.servers() or {})["database_url"]
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while loop.time() < deadline:
        try:
            if await caught_up(database_url) and await caught_up(database_url):
                expected = {i: await expected_events(database_url, w) for i, w in enumerate(record.watched)}
                if subscriptions_caught_up(record, expected):
                    return True
        except (psycopg.Error, OSError):
            pass
        await asyncio.sleep(0.5)
    return False
