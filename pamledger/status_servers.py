"""`pamledger status` beyond one server: every configured NATS node, where each ledger stream's leader and
replicas are (as JetStream reports them), and each Postgres read replica.

Why: a client connected to any node of a JetStream cluster sees the service work while another node is away,
and the query role reads the primary while a replica is away; status asked only the first connection, so a
cluster or a replica running degraded looked healthy. Each node and replica is probed on its own here, and
one that is away is a problem ("degraded": the service serves on, with less to lose before it stops).
"""

from __future__ import annotations

import asyncio
from typing import Any

import nats
import psycopg
from nats.js.errors import NotFoundError

from infra.nats_servers import greeting, server_urls, shown_nats_url
from query.replicas import shown_url

PROBE_SECONDS = 2.0


async def nats_nodes(nats_url: str) -> list[dict[str, Any]] | None:
    """Each configured node (PAMLEDGER_NATS_URL, comma-separated): whether it greets, its server name and
    version. None with one URL (one server: `nats.answers` says it all, as before clusters)."""
    urls = server_urls(nats_url)
    if len(urls) < 2:
        return None
    found = await asyncio.gather(*(greeting(url, PROBE_SECONDS) for url in urls))
    return [{"url": shown_nats_url(url), "answers": False, "error": f"no NATS greeting within {PROBE_SECONDS:g} s"}
            if info is None else
            {"url": shown_nats_url(url), "answers": True, "server_name": info.get("server_name"),
             "version": info.get("version"), "jetstream": bool(info.get("jetstream"))}
            for url, info in zip(urls, found)]


async def stream_placements(nc: Any, streams: list[str]) -> list[dict[str, Any]]:
    """Each ledger stream's replicas, leader and peers as JetStream reports them (asked at once: one timeout)."""
    js = nc.jetstream(timeout=PROBE_SECONDS + 1)
    return list(await asyncio.gather(*(_placement(js, stream) for stream in streams)))


async def _placement(js: Any, stream: str) -> dict[str, Any]:
    try:
        info = await js.stream_info(stream)
    except NotFoundError:
        return {"stream": stream, "missing": True}  # the relay makes it: no problem
    except (nats.errors.Error, asyncio.TimeoutError) as exc:  # no leader (an election, or no quorum)
        return {"stream": stream, "error": type(exc).__name__}
    cluster = info.cluster
    peers = [{"name": peer.name, "current": bool(peer.current), "offline": bool(peer.offline),
              "lag": int(peer.lag or 0)} for peer in (cluster.replicas or [] if cluster is not None else [])]
    return {"stream": stream, "replicas": int(info.config.num_replicas or 1),
            "leader": cluster.leader if cluster is not None else None, "peers": peers}


def with_leads(nodes: list[dict[str, Any]], placements: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each node with the streams it leads (by server name)."""
    for node in nodes:
        if node["answers"]:
            node["leads"] = [p["stream"] for p in placements if p.get("leader") == node["server_name"]]
    return nodes


async def read_replicas(database_url: str, read_urls: tuple[str, ...]) -> list[dict[str, Any]]:
    """Each read replica (database.read_urls): whether it answers, as a replica (in recovery), and how far
    its replay trails the primary's WAL position (bytes)."""
    position: str | None = None
    try:
        async with await psycopg.AsyncConnection.connect(database_url, autocommit=True,
                                                         connect_timeout=3) as conn:
            row = await (await conn.execute("SELECT pg_current_wal_lsn()::text")).fetchone()
            position = None if row is None else str(row[0])
    except psycopg.Error:
        pass  # the primary away: the replicas are still probed, without a lag
    return list(await asyncio.gather(*(_replica(url, position) for url in read_urls)))


async def _replica(url: str, position: str | None) -> dict[str, Any]:
    try:
        async with await psycopg.AsyncConnection.connect(url, autocommit=True, connect_timeout=3) as conn:
            row = await (await conn.execute(
                "SELECT pg_is_in_recovery(), pg_wal_lsn_diff(%s::pg_lsn, pg_last_wal_replay_lsn())",
                (position,))).fetchone()
    except psycopg.Error as exc:
        return {"url": shown_url(url), "answers": False, "error": type(exc).__name__}
    assert row is not None
    lag = None if row[1] is None else max(0, int(row[1]))
    return {"url": shown_url(url), "answers": True, "in_recovery": bool(row[0]), "lag_bytes": lag}


def degraded(report: dict[str, Any]) -> list[str]:
    """One sentence per node, stream replica or read replica that is away or behind (the service serves on)."""
    problems = []
    for node in report.get("nats", {}).get("nodes") or []:
        if not node["answers"]:
            problems.append(f"degraded: NATS node {node['url']} does not answer ({node['error']}); the cluster"
                            " serves on while most nodes do: bring it back (`pamledger run` restarts the nodes it"
                            " started)")
    for placement in report.get("nats", {}).get("streams") or []:
        problems.extend(_stream_problems(placement))
    away = set()
    for replica in report.get("postgres", {}).get("read_replicas") or []:
        if not replica["answers"]:
            away.add(replica["url"])
            problems.append(f"degraded: read replica {replica['url']} does not answer ({replica['error']}); queries"
                            " read the primary until it is back")
        elif not replica["in_recovery"]:
            away.add(replica["url"])
            problems.append(f"degraded: read replica {replica['url']} is not in recovery (promoted, or not a"
                            " replica): it is never read; name a streaming standby in database.read_urls")
    for replica in report.get("query", {}).get("database", {}).get("replicas") or []:
        if replica.get("state") == "away" and replica.get("url") not in away:  # the query role cannot reach it
            problems.append(f"degraded: the query role finds read replica {replica['url']} away"
                            f" ({replica.get('reason')}); it reads the primary meanwhile")
    return problems


def _stream_problems(placement: dict[str, Any]) -> list[str]:
    stream = placement["stream"]
    if "error" in placement:
        return [f"degraded: stream {stream} does not answer ({placement['error']}): no leader (an election, or"
                " too few nodes for a quorum); its relay and readers wait until JetStream elects one"]
    if placement.get("missing") or placement.get("replicas", 1) < 2:
        return []
    problems = [] if placement.get("leader") else [f"degraded: stream {stream} has no leader"]
    for peer in placement["peers"]:
        if peer["offline"] or not peer["current"]:
            state = "offline" if peer["offline"] else f"behind (lag {peer['lag']})"
            problems.append(f"degraded: stream {stream}'s replica on {peer['name']} is {state}; it catches up"
                            " from its peers once its node is back")
    return problems
