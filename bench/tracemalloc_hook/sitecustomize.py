"""Bench-only memory probe for a service child (python -m bench indexing --rss-tracemalloc): put this directory on the
child's PYTHONPATH and set PAMLEDGER_BENCH_TRACEMALLOC_DIR; Python imports this module at start-up.

It starts tracemalloc (PAMLEDGER_BENCH_TRACEMALLOC_FRAMES frames per trace, default 8) and, on each SIGUSR1,
dumps a snapshot to DIR/PID-N.snap and appends the gc counts (objects tracked per generation, live objects
by type for the 12 most common) to DIR/PID.gc.jsonl. The bench signals the role's process at points of its
progress and compares the snapshots: what grows with the embeddings, not what the follower buffers.

Why a sitecustomize and not code in the service: the probe slows allocation and has no place in the product;
a process started without the variable never imports tracemalloc (this module returns at once).
"""

from __future__ import annotations

import os

_DIR = os.environ.get("PAMLEDGER_BENCH_TRACEMALLOC_DIR")

if _DIR:
    _OUT: str = _DIR
    import collections
    import gc
    import json
    import signal
    import time
    import tracemalloc

    tracemalloc.start(int(os.environ.get("PAMLEDGER_BENCH_TRACEMALLOC_FRAMES", "8")))
    _count = [0]

    def _dump(signum: int, frame: object) -> None:
        _count[0] += 1
        pid = os.getpid()
        path = os.path.join(_OUT, f"{pid}-{_count[0]}.snap")
        tracemalloc.take_snapshot().dump(path + ".tmp")
        os.replace(path + ".tmp", path)  # complete when it appears; the gc line below comes after it
        objects = gc.get_objects()
        types = collections.Counter(type(o).__name__ for o in objects).most_common(12)
        with open(os.path.join(_OUT, f"{pid}.gc.jsonl"), "a") as out:
            out.write(json.dumps({"n": _count[0], "time": time.time(), "gc_count": gc.get_count(),
                                  "tracked": len(objects), "traced_bytes": tracemalloc.get_traced_memory()[0],
                                  "types": types}) + "\n")
        del objects

    signal.signal(signal.SIGUSR1, _dump)
