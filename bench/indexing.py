"""`python -m bench indexing`: the indexer against its embedder, its freshness, and its memory (issue #13).

Three measurements, each with its baseline from the same run, on a fresh database and private servers:

1. Throughput. The service runs without an indexer; an indexer process (`pamledger run --roles indexer`)
   starts once to register the space, and is stopped; N creates are committed; the indexer starts again
   and follows them. Committed embeddings/s = vectors committed between the indexer's first and last
   checkpoint move (model load excluded) / that time. Baseline: the raw embedder's batch throughput on the
   same texts (through the same text profile), in this process, while the servers idle: the mean of a run
   before the indexer's and one after (the load of a shared box drifts). Target >= 0.8x.
2. Freshness. All roles run; creates are paced open loop at `--rate`/s for `--seconds`; a LISTEN on the
   indexer's checkpoint channel notes when each create's ledger sequence became searchable. Lag = that
   time - the time the create's reply arrived (the writer replies after COMMIT). Target p99 <= 1 s at
   200 creates/s with the real model. Baseline: the same creates' reply latency.
3. Memory. The indexer's RSS sampled once a second while it embeds `--rss-objects` creates (hashing
   space by default: the model's memory is fixed; what could grow is ours). Flat = the last tenth's mean
   within 5% (or 10 MiB) of the middle (fifth) tenth's. Not the first tenths: while creates arrive faster
   than it embeds, the follower buffers up to `follower.max_ack_pending` (20,000) pushed events, and the
   allocator grows with it; a leak keeps growing after that. `--rss-max-ack-pending default,500` runs it
   once per buffer size, given to the indexer alone (PAMLEDGER_FOLLOWER__MAX_ACK_PENDING): with a small
   buffer what still grows is not the buffer. `--rss-tracemalloc` runs the indexer under tracemalloc
   (bench/tracemalloc_hook) and reports what its Python heap holds at points of the run and what grew.
   (`--max-ack-pending` does the same for throughput runs: whether a small buffer slows the indexer.)
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import signal
import statistics
import tempfile
import time
import tracemalloc
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgspec
import psutil  # type: ignore[import-untyped]
import psycopg
from psycopg import sql

from bench.embedding import corpus
from bench.load import ACTOR, PROVENANCE, check_result, drive_count
from bench.pace import lag_stats, paced_creates
from bench.procs import Child, python_child, wait_answering
from bench.servers import Servers, bench_servers
from bench.service import connect, service_names
from embedding.known import descriptor_for, embedder_for
from infra.settings import FollowerSettings
from pamledger_client.protocol.subjects import command_subject, status_subject

SCOPE = "workspace:m4-index"
CORE_ROLES = "writer,query,projector,gateway"


def create_bodies(texts: list[str]) -> list[bytes]:
    """One create (a claim whose statement is the text) per text."""
    return [msgspec.json.encode({"scope_id": SCOPE, "object_type": "claim", "actor": ACTOR,
                                 "provenance": PROVENANCE, "canonical_content": {"statement": t}})
            for t in texts]


class Bench:
    """The servers, a fresh database, and the service children of one run."""

    def __init__(self, servers: Servers, model: str, label: str, threads: int = 0) -> None:
        self.servers = servers
        self.model = model
        self.threads = threads  # the indexer's model threads (0: onnxruntime decides)
        _, self.url = servers.fresh_database(label)
        self.prefix, self.stream = service_names(label)
        self.children: list[Child] = []
        self._conn: psycopg.Connection[Any] | None = None

    def child(self, name: str, roles: str, env: dict[str, str] | None = None) -> Child:
        child = python_child(name, "pamledger", {
            "PAMLEDGER_NATS_URL": self.servers.nats_url, "PAMLEDGER_DATABASE_URL": self.url,
            "PAMLEDGER_SUBJECT_PREFIX": self.prefix, "PAMLEDGER_STREAM_NAME": self.stream,
            "PAMLEDGER_LOG_FORMAT": "json", "PAMLEDGER_INDEXER__DEFAULT_SPACE": self.model,
            "PAMLEDGER_INDEXER__MODEL_THREADS": str(self.threads),
            "PAMLEDGER_AUTH__MODE": "off", "PAMLEDGER_STATE_DIR": str(self.servers.work_dir / f"state-{self.prefix}"),
            **(env or {}),
        }, self.servers.work_dir, "run", "--roles", roles)
        self.children.append(child)
        return child.start()

    async def started(self, nc: Any, name: str, roles: str, env: dict[str, str] | None = None) -> Child:
        child = self.child(name, roles, env)
        for role in roles.split(","):
            await wait_answering(nc, child, status_subject(self.prefix, role), timeout=180)
        return child

    async def with_indexer(self, nc: Any, core: str, indexer: str, env: dict[str, str] | None = None) -> Child:
        """The service's core roles, the bench scope, and an indexer process (with `env` on top of the
        bench's settings) once its default space is ready."""
        await self.started(nc, core, CORE_ROLES)
        await ensure_scope(nc, self.prefix)
        child = await self.started(nc, indexer, "indexer", env)
        await wait_until(lambda: bool(self.query("SELECT 1 FROM embedding_spaces WHERE is_default AND state = 'ready'")),
                         180, "the default space registered and ready")
        return child

    def stop(self) -> None:
        for child in self.children:
            child.stop()
        if self._conn is not None:
            self._conn.close()

    def query(self, statement: str | sql.Composed, params: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
        # One connection for every poll: a connection per poll (every 10-50 ms) forks a Postgres backend
        # each time, CPU taken from the very indexer and database being measured.
        if self._conn is None or self._conn.closed:
            self._conn = psycopg.connect(self.url, autocommit=True)
        return self._conn.execute(statement, params).fetchall()

    def checkpoint(self) -> int:
        rows = self.query("SELECT ledger_sequence FROM projection_checkpoints WHERE projection = 'indexer'")
        return int(rows[0][0]) if rows else 0

    def head(self) -> int:
        return int(self.query("SELECT coalesce(max(ledger_sequence), 0) FROM ledger")[0][0])

    def vectors(self) -> int:
        rows = self.query("SELECT space_key FROM embedding_spaces WHERE is_default")
        if not rows:
            return 0
        found = self.query(sql.SQL("SELECT count(*) FROM {}").format(
            sql.Identifier(f"embedding_vectors_{int(rows[0][0])}")))
        return int(found[0][0]) if found else 0


def role_pids(child: Child, role: str) -> list[int]:
    """Pids of the processes serving `role` under a `pamledger run` supervisor."""
    found = []
    for proc in psutil.Process(child.pid).children(recursive=True):
        try:
            argv = proc.cmdline()
            if "--roles" in argv[:-1] and argv[argv.index("--roles") + 1] == role:
                found.append(proc.pid)
        except psutil.NoSuchProcess:
            continue
    return found


def gc_lines(folder: Path) -> int:
    return sum(len(p.read_text().splitlines()) for p in folder.glob("*.gc.jsonl"))


def tracemalloc_growth(folder: Path, top: int = 15) -> dict[str, Any]:
    """What grew between the indexer's snapshots (bench/tracemalloc_hook): the top allocation sites by growth
    from the snapshot at half the embeddings to the last one (both after the follower's buffer filled), and
    from the first to the last; and the gc counts at each snapshot."""
    snaps = sorted(folder.glob("*.snap"), key=lambda p: int(p.stem.split("-")[1]))
    out: dict[str, Any] = {"snapshots": [p.name for p in snaps], "gc": []}
    for gc_file in folder.glob("*.gc.jsonl"):
        out["gc"] = [json.loads(line) for line in gc_file.read_text().splitlines()]
    if len(snaps) < 2:
        return out
    loaded = [tracemalloc.Snapshot.load(str(p)) for p in snaps]
    ignore = [tracemalloc.Filter(False, tracemalloc.__file__),
              tracemalloc.Filter(False, "<frozen importlib._bootstrap>")]
    loaded = [snap.filter_traces(ignore) for snap in loaded]
    out["traced_mib"] = [round(sum(t.size for t in snap.traces) / 2**20, 2) for snap in loaded]

    def diff(old: tracemalloc.Snapshot, new: tracemalloc.Snapshot) -> list[dict[str, Any]]:
        stats = new.compare_to(old, "traceback")
        return [{"kib": round(st.size_diff / 1024, 1), "count": st.count_diff,
                 "where": [f"{f.filename.split('site-packages/')[-1].replace(str(Path.cwd()) + '/', '')}:{f.lineno}"
                           for f in st.traceback[-4:]]} for st in stats[:top]]

    out["growth_half_to_last"] = diff(loaded[len(loaded) // 2 - 1 if len(loaded) > 2 else 0], loaded[-1])
    out["growth_first_to_last"] = diff(loaded[0], loaded[-1])
    return out


def role_rss(child: Child, role: str) -> int:
    """RSS of the process serving `role` under a `pamledger run` supervisor (the supervisor itself excluded)."""
    total = 0
    for pid in role_pids(child, role):
        try:
            total += int(psutil.Process(pid).memory_info().rss)
        except psutil.NoSuchProcess:
            continue
    return total


async def wait_until(predicate: Callable[[], bool], timeout: float, what: str, interval: float = 0.2) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what} not reached within {timeout:g} s")
        await asyncio.sleep(interval)


async def create_all(nc: Any, prefix: str, bodies: list[bytes], tag: str,
                     marks: dict[int, Callable[[], None]] | None = None) -> float:
    """Commit every body (64 in flight); creates/s."""
    subject = command_subject(prefix, "create")
    result = await drive_count(nc, subject, "creates", lambda i: (bodies[i % len(bodies)], {
        "Pam-Idempotency-Key": f"bench:m4:{tag}:{i}"}), check_result, 64, len(bodies), marks or {})
    return result.rate


async def ensure_scope(nc: Any, prefix: str) -> None:
    msg = await nc.request(command_subject(prefix, "create_scope"),
                           msgspec.json.encode({"scope_id": SCOPE, "scope_kind": "workspace"}), timeout=30)
    check_result(msg.data, b"")


async def throughput(servers: Servers, model: str, n: int, batch: int, threads: int = 0,
                     max_ack_pending: int | None = None) -> dict[str, Any]:
    texts = corpus(n, most_clauses=3, seed=41)
    embedder = embedder_for(descriptor_for(model))
    assert embedder is not None
    embedder.embed(texts[:8])

    def raw_rate() -> float:
        t0 = time.perf_counter()
        for start in range(0, n, batch):
            embedder.embed(texts[start:start + batch])
        return n / (time.perf_counter() - t0)

    raw_before = raw_rate()
    bench = Bench(servers, model, f"m4_throughput_{max_ack_pending or 'default'}", threads)
    env = {} if max_ack_pending is None else {"PAMLEDGER_FOLLOWER__MAX_ACK_PENDING": str(max_ack_pending)}
    nc = await connect(servers.nats_url)
    try:
        first = await bench.with_indexer(nc, "m4-core", "m4-indexer-1")
        first.stop()
        creates = await create_all(nc, bench.prefix, create_bodies(texts), "throughput")
        head, base = bench.head(), bench.checkpoint()
        await bench.started(nc, "m4-indexer-2", "indexer", env)
        await wait_until(lambda: bench.checkpoint() > base, 300, "the indexer's first commit", 0.01)
        t_first, v_first = time.perf_counter(), bench.vectors()
        await wait_until(lambda: bench.checkpoint() >= head, 1800, "the indexer reaching the head", 0.05)
        seconds, vectors = time.perf_counter() - t_first, bench.vectors() - v_first
    finally:
        bench.stop()
        await nc.close()
    committed = vectors / seconds if seconds > 0 else float("nan")
    # The raw rate again once the servers idle: on a shared box the load drifts within a run, and the
    # indexer's rate is compared with the mean of the raw rate around it.
    raw_after = raw_rate()
    raw = (raw_before + raw_after) / 2
    return {"model": model, "objects": n, "indexer_threads": threads,
            "max_ack_pending": max_ack_pending or FollowerSettings().max_ack_pending, "creates_per_s": round(creates, 1),
            "raw_embed_per_s": round(raw, 1), "raw_before_after": [round(raw_before, 1), round(raw_after, 1)],
            "committed_per_s": round(committed, 1), "ratio": round(committed / raw, 3), "target": 0.8,
            "verdict": "PASS" if committed / raw >= 0.8 else "MISS"}


async def freshness(servers: Servers, model: str, rate: float, seconds: float) -> dict[str, Any]:
    bench = Bench(servers, model, "m4_fresh")
    nc = await connect(servers.nats_url)
    seen: list[tuple[int, float]] = []
    listener: asyncio.Task[None] | None = None
    try:
        await bench.with_indexer(nc, "m4-fresh-core", "m4-fresh-indexer")

        async def listen() -> None:
            async with await psycopg.AsyncConnection.connect(bench.url, autocommit=True) as conn:
                await conn.execute("LISTEN pamledger_indexer")
                async for note in conn.notifies():
                    seen.append((int(note.payload), time.monotonic()))

        listener = asyncio.create_task(listen())
        bodies = create_bodies(corpus(int(rate * (seconds + 2)) + 1, most_clauses=3, seed=43))
        paced = await paced_creates(nc, bench.prefix, bodies, lambda i: i, rate, 2.0, seconds, uuid.uuid4().hex[:6])
        last = max((c.sequence for c in paced.creates), default=0)
        await wait_until(lambda: bool(seen) and seen[-1][0] >= last, 120, "the indexer catching up", 0.05)
    finally:
        if listener is not None:
            listener.cancel()
        bench.stop()
        await nc.close()
    lags, replies = [], []
    for c in paced.measured():
        when = next((t for s, t in seen if s >= c.sequence), None)
        if when is not None:
            lags.append((when - c.replied) * 1e3)
        replies.append((c.replied - c.scheduled) * 1e3)
    stats = lag_stats(lags)
    return {"model": model, "rate": rate, "sustained": paced.sustained, "stopped": paced.stopped,
            "commit_to_searchable": stats, "reply_latency_baseline": lag_stats(replies),
            "target_p99_ms": 1000, "verdict": "PASS" if paced.sustained and stats["p99_ms"] <= 1000 else "MISS"}


HOOK_DIR = Path(__file__).resolve().parent / "tracemalloc_hook"
SNAPSHOT_AT = (0.2, 0.4, 0.6, 0.8)  # shares of the embeddings at which the probe dumps (and once caught up)


async def memory(servers: Servers, model: str, n: int, max_ack_pending: int | None = None,
                 trace: bool = False) -> dict[str, Any]:
    """RSS of the indexer while it follows n creates; `max_ack_pending` (None: the product's setting) is given
    to the indexer alone (PAMLEDGER_FOLLOWER__MAX_ACK_PENDING), so a run with a small buffer tells the
    buffer's share of the growth from a leak (which grows with embeddings whatever the buffer). With `trace`
    the indexer runs under tracemalloc (bench/tracemalloc_hook; slower, and its RSS includes the traces) and
    dumps snapshots at SNAPSHOT_AT of the embeddings and at the end."""
    label = f"m4_rss_{max_ack_pending or 'default'}{'_traced' if trace else ''}"
    bench = Bench(servers, model, label)
    env = {} if max_ack_pending is None else {"PAMLEDGER_FOLLOWER__MAX_ACK_PENDING": str(max_ack_pending)}
    folder = Path(tempfile.mkdtemp(prefix="m4_tracemalloc_")) if trace else None
    if folder is not None:
        env.update(PYTHONPATH=os.pathsep.join(x for x in (str(HOOK_DIR), os.environ.get("PYTHONPATH")) if x),
                   PAMLEDGER_BENCH_TRACEMALLOC_DIR=str(folder))
    dumped = [False] * len(SNAPSHOT_AT)
    nc = await connect(servers.nats_url)
    samples: list[tuple[float, float, int]] = []  # (seconds since the creates began, RSS MiB, indexer checkpoint)
    creates_done = 0.0
    try:
        indexer = await bench.with_indexer(nc, f"{label}-core", f"{label}-indexer", env)
        began = time.monotonic()

        def dump() -> None:
            for pid in role_pids(indexer, "indexer"):
                os.kill(pid, signal.SIGUSR1)

        async def sample() -> None:
            while True:
                samples.append((time.monotonic() - began, role_rss(indexer, "indexer") / 2**20, bench.checkpoint()))
                if folder is not None:
                    for i, share in enumerate(SNAPSHOT_AT):
                        if not dumped[i] and samples[-1][2] >= n * share:
                            dumped[i] = True
                            dump()
                await asyncio.sleep(1.0)

        sampler = asyncio.create_task(sample())
        rate = await create_all(nc, bench.prefix, create_bodies(corpus(n, most_clauses=3, seed=47)), "rss")
        creates_done = time.monotonic() - began
        head = bench.head()
        await wait_until(lambda: bench.checkpoint() >= head, 3600, "the indexer reaching the head", 0.5)
        caught_up = time.monotonic() - began
        sampler.cancel()
        vectors = bench.vectors()
        if folder is not None:
            dump()
            # The probe writes its gc line after the snapshot file is complete (renamed into place).
            await wait_until(lambda: gc_lines(folder) >= sum(dumped) + 1, 300, "the last tracemalloc snapshot")
    finally:
        bench.stop()
        await nc.close()
    rss = [m for _, m, _ in samples]
    tenth = max(1, len(rss) // 10)
    middle, late = statistics.fmean(rss[4 * tenth:5 * tenth]), statistics.fmean(rss[-tenth:])
    flat = late <= middle * 1.05 or late - middle <= 10
    by_tenth = [round(statistics.fmean(rss[i * tenth:(i + 1) * tenth]), 1) for i in range(10)
                if rss[i * tenth:(i + 1) * tenth]]
    # RSS when the indexer's checkpoint first reached each tenth of the ledger head: growth per embedding,
    # whatever the pace of the creates.
    by_progress = []
    for i in range(1, 11):
        at = next((m for _, m, c in samples if c >= head * i / 10), None)
        by_progress.append(round(at if at is not None else rss[-1], 1))
    # Growth in the second half of the embeddings, per 10,000: a leak shows as a steady slope here.
    half = [(c, m) for _, m, c in samples if c >= head / 2]
    slope = (half[-1][1] - half[0][1]) / max(1, half[-1][0] - half[0][0]) * 10_000 if len(half) > 1 else 0.0
    growth = tracemalloc_growth(folder) if folder is not None else None
    if folder is not None:
        shutil.rmtree(folder, ignore_errors=True)
    return {"model": model, "max_ack_pending": max_ack_pending or FollowerSettings().max_ack_pending,
            "embeddings": vectors,
            "creates_per_s": round(rate, 1), "creates_done_s": round(creates_done, 1),
            "caught_up_s": round(caught_up, 1), "samples": len(rss), "rss_mib_by_tenth": by_tenth,
            "rss_mib_by_tenth_of_embeddings": by_progress,
            "rss_mib_per_10k_second_half": round(slope, 2),
            "rss_mib_fifth_tenth": round(middle, 1),
            "rss_mib_last_tenth": round(late, 1), "rss_mib_max": round(max(rss), 1),
            "traced": trace, **({"tracemalloc": growth} if growth is not None else {}),
            "verdict": "PASS" if flat and vectors >= n else "MISS"}


async def run(args: argparse.Namespace) -> dict[str, Any]:
    out: dict[str, Any] = {}
    with bench_servers() as servers:
        if "throughput" in args.only:
            out["throughput"] = []
            for pending in args.max_ack_pending:
                found = await throughput(servers, args.model, args.objects, args.batch, args.threads, pending)
                out["throughput"].append(found)
                print(json.dumps(found), flush=True)
        if "freshness" in args.only:
            out["freshness"] = await freshness(servers, args.model, args.rate, args.seconds)
            print(json.dumps(out["freshness"]), flush=True)
        if "memory" in args.only:
            out["memory"] = []
            for pending in args.rss_max_ack_pending:
                found = await memory(servers, args.rss_model, args.rss_objects, pending, args.rss_tracemalloc)
                out["memory"].append(found)
                print(json.dumps(found), flush=True)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench indexing", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="minilm", help="space of the throughput and freshness runs")
    parser.add_argument("--objects", type=int, default=2000, help="creates the throughput run indexes")
    parser.add_argument("--batch", type=int, default=64, help="raw embedder batch (the indexer's batch)")
    parser.add_argument("--threads", type=int, default=0,
                        help="the indexer's model threads (PAMLEDGER_INDEXER__MODEL_THREADS; 0: onnxruntime decides)")
    parser.add_argument("--max-ack-pending", default="default",
                        help="comma list of the indexer's follower.max_ack_pending for throughput runs, one run each"
                             " ('default': the product's 20,000)")
    parser.add_argument("--rate", type=float, default=200.0, help="creates/s of the freshness run")
    parser.add_argument("--seconds", type=float, default=20.0, help="measured seconds of the freshness run")
    parser.add_argument("--rss-model", default="hashing-384", help="space of the memory run")
    parser.add_argument("--rss-objects", type=int, default=100_000, help="embeddings of the memory run")
    parser.add_argument("--rss-max-ack-pending", default="default",
                        help="comma list of the indexer's follower.max_ack_pending for memory runs, one run each"
                             " ('default': the product's 20,000), e.g. default,500")
    parser.add_argument("--rss-tracemalloc", action="store_true",
                        help="run the memory indexer under tracemalloc (bench/tracemalloc_hook) and report what grew"
                             " between its snapshots (slower; its RSS then includes the traces)")
    parser.add_argument("--only", default="throughput,freshness,memory")
    parser.add_argument("--json", default=None, help="also write the results here")
    args = parser.parse_args(argv)
    args.only = {x.strip() for x in args.only.split(",")}
    args.rss_max_ack_pending = [None if x.strip() == "default" else int(x)
                                for x in args.rss_max_ack_pending.split(",") if x.strip()]
    args.max_ack_pending = [None if x.strip() == "default" else int(x)
                            for x in args.max_ack_pending.split(",") if x.strip()]
    result = asyncio.run(run(args))
    if args.json:
        with open(args.json, "w") as out:
            json.dump(result, out, indent=2)
    return 0
