"""After a NATS restart the relay republishes at once, and an outage logs one line per state change.

Why: a relay publish in flight when NATS died waited out a 30 s ack timeout, so writes acknowledged just
after the restart reached neither the stream nor the projection nor subscribers for ~10 s; and every
reconnect attempt of every role logged a full traceback (17 MB of log in ten minutes down). Real
`pamledger run` processes against a NATS of the module's own, frozen and SIGKILLed under a write load.
"""

from __future__ import annotations

import asyncio
import os
import signal
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from pamledger_client.client import MemoryClient, PamspecError
from tests.conftest import ACTOR, PROVENANCE, Env, wait_for
from tests.integration.test_faults import SCOPE, ServiceProcess, connect, leader_pid
from tests.integration.test_faults import fault_env, nats_private, pair  # noqa: F401,F811 - module-scoped here too
from tests.integration.test_writer import assert_stream_equals_ledger

FROZEN_SECONDS = 1.0
DOWN_SECONDS = 3.0  # how long NATS stays away: the outage itself, not a wait for a condition
STALE_ACK_SECONDS = 30  # the relay's publish timeout here: the old ack wait from before the outage
# Measured from the write's acknowledgement. A relay waiting out the stale ack would project it only at
# about STALE_ACK_SECONDS after the freeze (over 20 s after the acknowledgement); idle it takes under 1 s,
# and half the stale wait leaves a loaded 2-core box room while still telling the two apart.
PROJECTED_WITHIN = STALE_ACK_SECONDS / 2


@pytest.fixture(scope="module", autouse=True)
def stale_ack_is_long() -> Iterator[None]:
    """The `pamledger run` processes (they inherit this environment) get the old 30 s publish timeout, so
    the bound below shows the reconnect fix itself, not only the shorter default timeout."""
    key = "PAMLEDGER_WRITER__RELAY_PUBLISH_TIMEOUT_SECONDS"
    before = os.environ.get(key)
    os.environ[key] = str(STALE_ACK_SECONDS)
    yield
    if before is None:
        del os.environ[key]
    else:
        os.environ[key] = before


def log_size(procs: list[ServiceProcess]) -> list[int]:
    return [Path(p.log.name).stat().st_size for p in procs]


def log_since(procs: list[ServiceProcess], sizes: list[int]) -> str:
    text = ""
    for proc, size in zip(procs, sizes):
        with open(proc.log.name, "rb") as f:
            f.seek(size)
            text += f.read().decode(errors="replace")
    return text


async def write_until(client: MemoryClient, stop: asyncio.Event, acked: list[int]) -> None:
    """Creates one after another until `stop`, riding out the outage; record what was acknowledged."""
    while not stop.is_set():
        try:
            result = await client.create(SCOPE, "claim", {"load": True}, ACTOR, PROVENANCE,
                                         idempotency_key=f"nr:{uuid.uuid4()}")
            acked.append(result["ledger_sequence"])
        except PamspecError:
            await asyncio.sleep(0.05)


async def projected_to(client: MemoryClient) -> int:
    retries, client.retries = client.retries, 0
    try:
        return int((await client.query(SCOPE, min_sequence=0, limit=1))["as_of_sequence"])
    except PamspecError:
        return -1
    finally:
        client.retries = retries


async def test_a_write_right_after_a_nats_restart_is_projected_at_once_and_the_outage_logs_no_tracebacks(
        pair: list[ServiceProcess], fault_env: Env, nats_private: Any) -> None:  # noqa: F811
    client = await connect(fault_env)
    await wait_for(lambda: leader_pid(client), timeout=60)
    stop, acked = asyncio.Event(), []
    loaders = [asyncio.create_task(write_until(client, stop, acked)) for _ in range(8)]
    await wait_for(lambda: len(acked) >= 50, timeout=120)  # the relay is publishing when NATS dies

    # Freeze the server first: commands it already handed the writer still commit, and their relay
    # publishes go into the frozen server's socket, never to be acknowledged.
    os.kill(nats_private.pid, signal.SIGSTOP)
    await asyncio.sleep(FROZEN_SECONDS)
    sizes = log_size(pair)
    nats_private.kill()
    await asyncio.sleep(DOWN_SECONDS)
    down_log = log_since(pair, sizes)
    nats_private.restart()

    await wait_for(lambda: leader_pid(client), timeout=60)
    await wait_for(lambda: leader_pid(client, "projector"), timeout=60)
    stop.set()
    await asyncio.gather(*loaders)
    created = await client.create(SCOPE, "claim", {"after": "restart"}, ACTOR, PROVENANCE)
    acknowledged = asyncio.get_running_loop().time()
    await wait_for(lambda: _at_least(client, created["ledger_sequence"]), timeout=60, interval=0.1)
    took = asyncio.get_running_loop().time() - acknowledged
    assert took < PROJECTED_WITHIN, f"projected {took:.1f}s after it was acknowledged (a stale ack wait?)"
    await assert_stream_equals_ledger(client.nc, fault_env)

    assert "Traceback" not in down_log, "a reconnect attempt logged a traceback"
    lines = down_log.count("\n")
    # Two `pamledger run` (a supervisor and four roles each): a few lines per connection, not one per attempt.
    assert lines < 80, f"{lines} log lines in {DOWN_SECONDS}s of NATS down:\n{down_log[-3000:]}"
    await client.close()


async def _at_least(client: MemoryClient, sequence: int) -> bool:
    return await projected_to(client) >= sequence
