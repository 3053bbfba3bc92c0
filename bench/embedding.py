"""`python -m bench embedding`: embeddings/s of the embedders on the same texts, batched, in one run.

Why: the indexer's throughput target (issue #13) is a ratio against the raw embedder's batch throughput;
this measures that raw figure for MiniLM (int8 ONNX) at a few batch sizes, with the feature-hashing
embedder as the in-run baseline (no model: the cost of Python around the vectors). No servers needed.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import time
from collections.abc import Sequence
from typing import Any

from embedding.embedders import Embedder, FeatureHashingEmbedder, MiniLMEmbedder
from embedding.text_profile import prepare

SUBJECTS = ("The deployment", "Our agent", "The ledger", "A customer", "The planner", "The nightly job",
            "The search index", "The finance team", "A reviewer", "The cache")
VERBS = ("recorded", "rejected", "summarised", "approved", "observed", "scheduled", "migrated", "flagged")
OBJECTS = ("the quarterly revenue report", "a failing database migration", "the staging rollout",
           "three duplicate invoices", "the user's travel preferences", "an expired API token",
           "the new embedding model", "a disputed claim about latency", "the backlog of support tickets")
TAILS = ("after the outage on Tuesday", "because the budget changed", "with a note for the on-call engineer",
         "and linked the evidence", "while the retention policy was under review", "before the audit")


def corpus(n: int, most_clauses: int = 4, seed: int = 13) -> list[str]:
    """n claim texts of 1 to most_clauses clauses (~12 words each), deterministic, through the profile."""
    rng = random.Random(seed)
    texts = []
    for _ in range(n):
        parts = [f"{rng.choice(SUBJECTS)} {rng.choice(VERBS)} {rng.choice(OBJECTS)} {rng.choice(TAILS)}."
                 for _ in range(rng.randint(1, most_clauses))]
        texts.append(prepare("claim", {"statement": " ".join(parts)}).text)
    return texts


def rate(embedder: Embedder, texts: Sequence[str], min_seconds: float) -> tuple[float, int]:
    """Texts per second over whole passes of `texts` lasting at least min_seconds (after one warm-up batch)."""
    embedder.embed(texts[:8])
    done, start = 0, time.perf_counter()
    while True:
        embedder.embed(texts)
        done += len(texts)
        elapsed = time.perf_counter() - start
        if elapsed >= min_seconds:
            return done / elapsed, done


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench embedding", description=__doc__)
    parser.add_argument("--texts", type=int, default=512, help="distinct texts per pass (default 512)")
    parser.add_argument("--seconds", type=float, default=5.0, help="minimum measured seconds per row (default 5)")
    parser.add_argument("--batches", default="1,16,32,64", help="MiniLM batch sizes (default 1,16,32,64)")
    parser.add_argument("--json", default=None, help="also write the rows as JSON to this path")
    args = parser.parse_args(argv)
    texts = corpus(args.texts)
    words = sum(len(t.split()) for t in texts) / len(texts)
    print(f"{len(texts)} mixed texts (1-4 clauses), {words:.1f} words on average, and as many short ones"
          f" (1 clause); {os.cpu_count()} cores; load {os.getloadavg()}")
    short = corpus(args.texts, most_clauses=1)
    rows: list[dict[str, Any]] = []

    def measure(name: str, embedder: Embedder, batch: int, corpus_name: str, texts: list[str]) -> None:
        per_second, count = rate(embedder, texts, args.seconds)
        rows.append({"embedder": name, "batch": batch, "texts": corpus_name, "per_second": per_second,
                     "embedded": count})

    measure("feature-hashing-384", FeatureHashingEmbedder(384), len(texts), "mixed", texts)
    for batch in (int(b) for b in args.batches.split(",")):
        measure("minilm-l6-v2-int8", MiniLMEmbedder(batch_size=batch), batch, "mixed", texts)
    measure("minilm-l6-v2-int8", MiniLMEmbedder(batch_size=32), 32, "short", short)
    print(f"{'embedder':<22}{'batch':>6}{'texts':>7}{'embeddings/s':>14}{'ms/text':>9}")
    for row in rows:
        print(f"{row['embedder']:<22}{row['batch']:>6}{row['texts']:>7}{row['per_second']:>14.0f}"
              f"{1000 / row['per_second']:>9.2f}")
    if args.json:
        with open(args.json, "w") as out:
            json.dump(rows, out, indent=2)
    return 0
