"""`pamledger run` gives the indexer a process of its own at a lower OS priority than the writer's, so the
embedder yields the CPU to the write path when they compete (issue [P1]); `PAMLEDGER_INDEXER__NICE=0` keeps
them level."""

from __future__ import annotations

from pathlib import Path

import psutil
import pytest

from tests.conftest import TEST_SPACE, pamledger_run, wait_for


def role_niceness(pid: int) -> dict[str, int]:
    found = {}
    for child in psutil.Process(pid).children(recursive=True):
        try:
            argv = child.cmdline()
            if "--roles" in argv[:-1]:
                found[argv[argv.index("--roles") + 1]] = child.nice()
        except psutil.Error:
            continue
    return found


@pytest.mark.parametrize("nice, expected", [(None, 10), ("0", 0)])
async def test_the_indexer_process_runs_below_the_writer(tmp_path: Path, nice: str | None, expected: int) -> None:
    extra = {"PAMLEDGER_INDEXER__NICE": nice} if nice is not None else {}
    ours = psutil.Process().nice()  # os.nice is relative: the roles start at the test's own niceness
    with pamledger_run(tmp_path, PAMLEDGER_INDEXER__DEFAULT_SPACE=TEST_SPACE, **extra) as (proc, _, _):
        roles = await wait_for(lambda: (r := role_niceness(proc.pid)) and {"indexer", "writer"} <= r.keys()
                               and r["indexer"] == min(19, ours + expected) and r, timeout=60)
        assert roles["writer"] == ours
