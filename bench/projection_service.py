"""The real service (`python -m pamledger run`) on an already loaded database, and a writer probe.

A loaded ledger has no JetStream replica yet; started as is, the relay would first republish every
ledger row. The stream is therefore created with `first_seq = head`, stamped with the ledger's id and holding
the head event only (a replica whose older messages were purged): the roles' identity check finds it the
ledger's, the relay finds it caught up, the projector (checkpoint = head) follows from head + 1, and new
writes flow through the whole pipeline as in production.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from typing import Any

import msgspec
import psycopg
from nats.aio.client import Client as NATS

from bench.load import ACTOR, PROVENANCE, REQUEST_TIMEOUT, check_result
from bench.procs import Child
from bench import service
from bench.servers import Servers
from command_handler.relay import Relay, ensure_stream_config
from infra.ledger_identity import ledger_identity
from pamledger_client.protocol.subjects import command_subject, ledger_subject, query_subject


async def connect(url: str) -> NATS:
    return await service.connect(url, "pamledger-bench-m2")


@contextlib.asynccontextmanager
async def service_on(servers: Servers, database_url: str, head: int, label: str,
                     answering: tuple[str, ...] = ("writer", "query", "projector", "gateway")
                     ) -> AsyncIterator[tuple[NATS, str, Child]]:
    """Start the service on `database_url` (ledger head `head`, projection checkpoint = head); stop it after.
    `answering`: the roles whose status subjects must answer first."""

    async def replica_at_head(nc: NATS, prefix: str, stream: str) -> None:
        """The stream stamped with the ledger's id, holding its head event only (the roles check that the
        stream's last message is the ledger's: infra.ledger_identity)."""
        async with await psycopg.AsyncConnection.connect(database_url, autocommit=True) as conn:
            ledger_id = await ledger_identity(conn, 0)
            relay = Relay(nc, database_url, stream, prefix, 0)
            rows = await relay.read_ledger(conn, head - 1)
        config = ensure_stream_config(stream, prefix, ledger_id)
        config.first_seq = head
        js = nc.jetstream()
        await js.add_stream(config)
        if rows:
            row = rows[0]
            await js.publish(ledger_subject(prefix, 0, row.scope_id, row.event_type), row.event,
                             headers=Relay._headers(row))

    async with service.service_process(servers, database_url, label, prepare=replica_at_head,
                                       answering=answering, timeout=60) as (nc, prefix, _stream, child):
        yield nc, prefix, child


async def writer_probe(nc: NATS, prefix: str, item: dict[str, Any], head: int) -> dict[str, Any]:
    """Update one loaded object through NATS, then wait (Query min_sequence) for the projection to show it.

    Proves the writer continues the loaded hash chain from its tail and that relay and projector carry
    on from the loaded head.
    """
    envelope = item["envelope"]
    body = msgspec.json.encode({
        "scope_id": envelope["scope_id"], "object_id": envelope["object_id"],
        "expected_version_id": envelope["version_id"], "canonical_content": {"text": "m2 writer probe"},
        "actor": ACTOR, "provenance": PROVENANCE,
    })
    msg = await nc.request(command_subject(prefix, "update"), body, timeout=REQUEST_TIMEOUT)
    check_result(msg.data, body)
    sequence = int(msgspec.json.decode(msg.data)["result"]["ledger_sequence"])
    query = msgspec.json.encode({"scope_id": envelope["scope_id"], "min_sequence": sequence, "wait_ms": 10_000,
                                 "limit": 1, "validation_states": [envelope["validation_state"]],
                                 "lifecycle_states": [envelope["lifecycle_state"]]})
    reply = await nc.request(query_subject(prefix, "query"), query, timeout=REQUEST_TIMEOUT)
    check_result(reply.data, query)
    result = msgspec.json.decode(reply.data)["result"]
    top = result["items"][0]["envelope"] if result["items"] else {}
    return {"ledger_sequence": sequence, "expected_sequence": head + 1,
            "projection_reached": bool(result.get("min_sequence_reached")),
            "newest_is_probe": top.get("object_id") == envelope["object_id"],
            "ok": sequence == head + 1 and bool(result.get("min_sequence_reached"))
            and top.get("object_id") == envelope["object_id"]}
