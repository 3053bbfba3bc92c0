"""The soak's 60-second version (`make soak` runs it, then minutes of the same; `make test` leaves it out to
stay near ten minutes; the kills have quicker tests of their own there: test_faults, test_subscribe_faults,
test_indexer_restart, test_run_restarts_servers, test_nats_cluster, test_partitions).

A mixed load through the SDK on a real `pamledger run`, auth enforced, while the writer, query, projector,
indexer, gateway, nats-server and Postgres are each SIGKILLed at least once; then every check of the audit
passes (soak/audit.py). Real servers, no mocks.
"""

from __future__ import annotations

import pytest

from soak.report import table
from soak.run import Options, soak

pytestmark = pytest.mark.soak


async def test_a_minute_of_kills_loses_nothing() -> None:
    report = await soak(Options(duration=60, kill_interval=4, seed=1))
    assert report["passed"], table(report)
    assert all(row["kills"] >= 1 and row["not_recovered"] == 0 for row in report["kills"].values()), table(report)
    assert report["acknowledged_writes"] > 0 and report["erased_canaries"] > 0, table(report)
