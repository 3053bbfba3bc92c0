"""The soak's 60-second version (`make soak` runs minutes): a mixed load through the SDK on a real `pamledger
run`, auth enforced, while the writer, query, projector, indexer, gateway, nats-server and Postgres are each
SIGKILLed at least once; then every check of the audit passes (soak/audit.py). Real servers, no mocks.
"""

from __future__ import annotations

from soak.report import table
from soak.run import Options, soak


async def test_a_minute_of_kills_loses_nothing() -> None:
    report = await soak(Options(duration=60, kill_interval=4, seed=1))
    assert report["passed"], table(report)
    assert all(row["kills"] >= 1 and row["not_recovered"] == 0 for row in report["kills"].values()), table(report)
    assert report["acknowledged_writes"] > 0 and report["erased_canaries"] > 0, table(report)
