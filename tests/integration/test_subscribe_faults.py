"""Subscribe survives crashes: SIGKILL of the leading gateway process and a NATS restart, during
delivery. The subscriber ends with every matching event exactly once, in ledger order."""

from __future__ import annotations

import asyncio
import os
import signal
import uuid
from typing import Any


from tests.conftest import ACTOR, PROVENANCE, Env, wait_for
from tests.integration.test_faults import SCOPE, ServiceProcess, connect, leader_pid
from tests.integration.test_faults import fault_env, nats_private, pair  # noqa: F401,F811 - module-scoped here too

TOTAL = 240


async def test_every_event_exactly_once_in_order_across_a_gateway_kill_and_a_nats_restart(
        pair: list[ServiceProcess], fault_env: Env, nats_private: Any) -> None:  # noqa: F811
    writer_client = await connect(fault_env)
    reader_client = await connect(fault_env)
    created: list[str] = []
    received: list[dict[str, Any]] = []
    sub = await reader_client.subscribe(SCOPE, ACTOR, after_sequence=0,
                                        filter={"event_classes": ["object_created"]},
                                        delivery={"keepalive_interval_ms": 500})

    async def write() -> None:
        for i in range(TOTAL):
            result = await writer_client.create(SCOPE, "claim", {"n": i}, ACTOR, PROVENANCE,
                                                idempotency_key=f"sf:{uuid.uuid4()}")
            created.append(result["object_id"])
            await asyncio.sleep(0.01)

    async def read() -> None:
        async for event in sub:
            received.append(event)
            if len(received) >= TOTAL:
                return

    writer = asyncio.create_task(write())
    reader = asyncio.create_task(read())
    await wait_for(lambda: len(received) >= TOTAL // 3, timeout=120)
    gateway = await wait_for(lambda: leader_pid(writer_client, "gateway"), timeout=30)
    os.kill(gateway, signal.SIGKILL)
    await wait_for(lambda: len(received) >= 2 * TOTAL // 3, timeout=180)
    nats_private.kill()
    nats_private.restart()
    await asyncio.wait_for(writer, timeout=300)
    await asyncio.wait_for(reader, timeout=300)
    sequences = [e["ledger_sequence"] for e in received]
    assert sequences == sorted(sequences), "events out of ledger order"
    assert len(set(sequences)) == len(sequences), "an event was handed out twice"
    assert [e["event"]["object_id"] for e in received] == created
    await sub.close()
    await writer_client.close()
    await reader_client.close()
