"""Each role of a real `pamledger run` serves /metrics, /healthz and /readyz (infra.probes): the counters move
after creates, labels carry no ids, /readyz answers fast, turns not-ready when Postgres is killed and ready
again once the supervisor brought it back."""

from __future__ import annotations

import os
import random
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from local_servers.launch import read_servers_file
from pamledger.runtime import PROBE_OFFSETS
from tests.conftest import pamledger_run, wait_for
from tests.integration.test_run_restarts_servers import _write


def free_base() -> int:
    """A base port with the next six free (one per role's offset)."""
    for _ in range(200):
        base = random.randint(20_000, 60_000)
        try:
            sockets = [socket.create_server(("127.0.0.1", base + i)) for i in range(len(PROBE_OFFSETS))]
        except OSError:
            continue
        for s in sockets:
            s.close()
        return base
    raise RuntimeError("no free ports")


def get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()
    except OSError:
        return 0, ""


def sample(text: str, name: str, **labels: str) -> float:
    """The value of one sample of the Prometheus text (0 when absent)."""
    want = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
    for line in text.splitlines():
        if line.startswith(f"{name}{{") or line.startswith(f"{name} "):
            head, _, value = line.rpartition(" ")
            found = head[len(name):].strip("{}")
            if ",".join(sorted(found.split(","))) == want or (not labels and not found):
                return float(value)
    return 0.0


@pytest.fixture
def run(tmp_path: Path) -> Iterator[tuple[subprocess.Popen[bytes], Path, int]]:
    base = free_base()
    with pamledger_run(tmp_path, PAMLEDGER_METRICS__PORT=str(base), PAMLEDGER_INDEXER__DEFAULT_SPACE="hashing-16") \
            as (proc, state, _):
        yield proc, state, base


async def test_metrics_move_and_readiness_follows_postgres(run: tuple[subprocess.Popen[bytes], Path, int]) -> None:
    proc, state, base = run
    writer, query = f"http://127.0.0.1:{base}", f"http://127.0.0.1:{base + PROBE_OFFSETS['query']}"
    first = await wait_for(lambda: read_servers_file(state), timeout=180)
    await wait_for(lambda: _write(first["nats_url"], "first", state), timeout=180)
    await wait_for(lambda: get(f"{writer}/readyz")[0] == 200, timeout=60)
    before = sample(get(f"{writer}/metrics")[1], "pamledger_commands_total", command="create", outcome="committed")
    for label in ("a", "b", "c"):
        assert await _write(first["nats_url"], label, state)
    text = get(f"{writer}/metrics")[1]
    assert sample(text, "pamledger_commands_total", command="create", outcome="committed") == before + 3
    assert sample(text, "pamledger_role_leader", role="writer") == 1
    assert sample(text, "pamledger_ledger_head") > 0
    assert "scope_id" not in text and "workspace:" not in text and "mem:" not in text  # no unbounded labels
    assert 'kind="whoami"' in get(f"{query}/metrics")[1]  # _write asks whoami before each create
    assert get(f"{writer}/healthz") == (200, '{"alive":true}')
    started = time.perf_counter()
    status, body = get(f"{writer}/readyz")
    assert status == 200 and time.perf_counter() - started < 0.5, body  # well under the probe's budget here
    assert '"leading":["writer"]' in body

    for junk in (b"GET /" + b"a" * 200_000 + b" HTTP/1.1\r\n\r\n", b"\x00\xff\r\n", b""):  # no answer, no harm
        with socket.create_connection(("127.0.0.1", base), timeout=5) as raw:
            raw.sendall(junk)
            raw.shutdown(socket.SHUT_WR)
            raw.recv(100)
    assert get(f"{writer}/healthz")[0] == 200 and get(f"{writer}/nowhere")[0] == 404

    os.kill(first["postgres_pid"], signal.SIGKILL)
    down = await wait_for(lambda: (lambda r: r if r[0] == 503 else None)(get(f"{writer}/readyz")), timeout=60,
                          interval=0.02)
    assert '"postgres"' in down[1]
    await wait_for(lambda: get(f"{writer}/readyz")[0] == 200, timeout=180)
    assert proc.poll() is None
