"""Projection checkpoint listener for the lag benchmark: LISTEN pamledger_projection, log arrivals.

    python -m bench.projection_listen DATABASE_URL OUT_PATH

Writes one line per notification, `<time.monotonic()> <checkpoint>`, to OUT_PATH (the first line is the
checkpoint read at start). time.monotonic is CLOCK_MONOTONIC, shared by every process on the machine,
so the benchmark can compare these times with its own. Runs in its own process so the load generator's
event loop cannot delay the timestamps; stops on SIGTERM.
"""

from __future__ import annotations

import signal
import sys
import time

import psycopg

from infra.projections import NOTIFY_CHANNEL


def main() -> int:
    url, out_path = sys.argv[1], sys.argv[2]
    stop = False

    def on_term(signum: int, frame: object) -> None:
        nonlocal stop
        stop = True

    signal.signal(signal.SIGTERM, on_term)
    signal.signal(signal.SIGINT, on_term)
    with psycopg.connect(url, autocommit=True) as conn, open(out_path, "w", buffering=1) as out:
        conn.execute(f"LISTEN {NOTIFY_CHANNEL}")
        row = conn.execute("SELECT coalesce(max(ledger_sequence), 0) FROM projection_checkpoints"
                           " WHERE projection = 'current_objects'").fetchone()
        out.write(f"{time.monotonic()} {row[0] if row else 0}\n")
        out.write("ready\n")
        while not stop:
            for note in conn.notifies(timeout=0.2):
                out.write(f"{time.monotonic()} {int(note.payload)}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
