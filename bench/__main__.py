"""`python -m bench [NAME] [ARGS]`: one entry for every benchmark; NAME defaults to write_path.

Each benchmark measures its baselines in the same run and parses its own ARGS (`python -m bench NAME --help`);
`python -m bench --list` names them. See bench/README.md.
"""

from __future__ import annotations

import importlib
import sys

DEFAULT = "write_path"

# name -> what it measures; the module is bench.<name>, its entry `main(argv) -> int`
BENCHMARKS: dict[str, str] = {
    "write_path": "durable creates/s and latency vs echo, a naive writer, eventsourcing, the append and commit floors",
    "cpu": "CPU per create by process and role under write_path's load, vs echo's CPU per request",
    "projection": "ledger load, replay vs raw COPY, Query latency, commit -> queryable lag, the projector alone",
    "subscribe": "SDK catch-up vs a raw JetStream consumer, live delivery lag, fan-out to 1,000 subscriptions",
    "embedding": "embeddings/s of MiniLM by batch size vs the feature-hashing embedder (no servers)",
    "indexing": "the indexer's committed vectors/s vs its raw embedder, commit -> searchable lag, its memory",
    "search": "scoped vector search SQL, exact and HNSW: recall@10 and latency vs SELECT 1 and exact search",
    "search_service": "Search through the service (semantic, lexical, hybrid) vs a status round trip and its SQL",
    "auth": "write_path's creates with authorization off and enforced, in alternating pairs",
    "auth_check": "the writer's per-command authorization step in-process, by part, vs parsing the create",
    "mcp": "the MCP binding vs the SDK it wraps: read latency, creates/s, memory per idle HTTP session",
    "snapshot": "query and semantic search at a sealed snapshot vs live (p50 ratios, recall@10), kept-vector storage",
    "bundle": "export rows/s vs a raw COPY of the same rows, export RSS at two sizes, import vs creates/s",
    "replica_reads": "Query p50 through the service reading a streaming replica (fenced) vs reading the primary",
    "stream_replicas": "the relay's events/s and ack latency with an R3 stream on a 3-node cluster vs R1 on one server",
    "evaluation": "snapshot_create at 100k objects vs a create, Query at a sealed snapshot vs the same live Query",
    "partitions": "creates/s and CPU per create with 1, 2 and 4 partitions (a writer process each), over many scopes",
}


def listing() -> str:
    width = max(map(len, BENCHMARKS))
    lines = [f"  {name:<{width}}  {what}" for name, what in BENCHMARKS.items()]
    return "\n".join([f"usage: python -m bench [NAME] [ARGS]   NAME defaults to {DEFAULT};",
                      "       python -m bench NAME --help  for its ARGS", "benchmarks:", *lines])


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark named first in argv (write_path when argv starts with an option) with the rest."""
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] in ("--list", "list", "help", "-h", "--help"):
        print(listing())
        return 0
    name, rest = (argv[0], argv[1:]) if argv and not argv[0].startswith("-") else (DEFAULT, argv)
    if name not in BENCHMARKS:
        print(f"python -m bench: unknown benchmark {name!r}\n{listing()}", file=sys.stderr)
        return 2
    module = importlib.import_module(f"bench.{name}")
    return int(module.main(rest))


if __name__ == "__main__":
    sys.exit(main())
