"""The search benchmark's data: real-ish texts, their MiniLM vectors, clustered synthetic vectors, scopes,
and the binary COPY stream that loads them into one space's vector table.

Why clustered: uniform noise in 384 dimensions has no neighbourhoods (every vector is about equally far
from every other), so an approximate index looks perfect or hopeless for reasons unrelated to real data.
Each synthetic vector is a real MiniLM vector (or a blend of two) plus gaussian noise of a per-vector
sigma, L2-normalised: clusters around real meanings, at varying tightness.
"""

from __future__ import annotations

import random
import struct
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np

from bench.pgcopy import HEADER, TRAILER

DOMAINS: tuple[tuple[tuple[str, ...], tuple[str, ...], tuple[str, ...], tuple[str, ...]], ...] = (
    (("The deployment", "The staging cluster", "The nightly job", "The release train", "The canary"),
     ("failed during", "was rolled back after", "recovered from", "slowed down during", "was paused for"),
     ("the database migration", "a certificate rotation", "the load balancer change", "the kernel upgrade",
      "a config push to every region", "the schema backfill"),
     ("on Tuesday night", "while traffic peaked", "and paged the on-call engineer", "without data loss",
      "until the disk filled up")),
    (("The finance team", "Our controller", "The auditor", "The budget owner", "Accounts payable"),
     ("approved", "flagged", "rejected", "reconciled", "questioned"),
     ("the quarterly revenue report", "three duplicate invoices", "a late vendor payment",
      "the travel expense claims", "the cloud spending forecast", "the payroll adjustment"),
     ("before the audit", "because the budget changed", "after a currency conversion error",
      "for the second time this month", "pending the CFO's signature")),
    (("The customer", "A long-time user", "The enterprise client", "A trial account", "The support lead"),
     ("complained about", "asked for a refund of", "praised", "reported a bug in", "requested a demo of"),
     ("the mobile checkout", "the search results page", "the new pricing plan", "the export to spreadsheet",
      "the password reset email", "the onboarding tutorial"),
     ("in a support ticket", "on a call with sales", "in the community forum", "after the last update",
      "and threatened to cancel")),
    (("The agent", "Our planner", "The assistant", "The summariser", "The retrieval step"),
     ("remembered", "forgot", "contradicted", "summarised", "cited"),
     ("the user's travel preferences", "a disputed claim about latency", "the meeting notes from Monday",
      "the user's dietary restrictions", "an outdated policy document", "the project deadline"),
     ("when answering a follow-up question", "in its final answer", "despite a newer memory",
      "with a link to the evidence", "during a long conversation")),
    (("The research group", "A graduate student", "The lab manager", "The reviewer", "Our data scientist"),
     ("published", "reproduced", "retracted", "benchmarked", "criticised"),
     ("the protein folding results", "a climate model of the Arctic", "the new embedding model",
      "a survey of sleep patterns", "the vaccine trial data", "an analysis of river pollution"),
     ("at the spring conference", "with an open data set", "after a statistical error was found",
      "using twice the compute budget", "in a preprint last week")),
    (("The kitchen", "Our chef", "The bakery", "The catering team", "A food critic"),
     ("ran out of", "experimented with", "reviewed", "changed the recipe for", "sourced"),
     ("the sourdough bread", "fresh basil and tomatoes", "the seasonal dessert menu", "gluten-free pasta",
      "the vegetarian lasagna", "locally roasted coffee"),
     ("before the dinner rush", "for the wedding party", "after a supplier delay", "to cut food waste",
      "for the weekend market")),
    (("The city council", "The mayor's office", "A neighbourhood group", "The transit authority", "Residents"),
     ("voted against", "proposed", "delayed", "funded", "protested"),
     ("the new bike lanes", "a rent control measure", "the downtown stadium", "the night bus routes",
      "a park renovation", "the school district budget"),
     ("at a packed public hearing", "despite strong opposition", "after months of debate",
      "pending an environmental review", "with a narrow majority")),
    (("The hiking club", "Our travel group", "A solo traveller", "The tour guide", "The family"),
     ("booked", "cancelled", "explored", "got lost on", "photographed"),
     ("a trail in the Alps", "the night train to Vienna", "a guesthouse by the lake", "the old harbour",
      "a ferry to the islands", "the glacier viewpoint"),
     ("because of a storm warning", "in early autumn", "with rented e-bikes", "on a tight budget",
      "after reading online reviews")),
)


def texts(n: int, seed: int, exclude: frozenset[str] = frozenset()) -> list[str]:
    """n distinct texts of 1-3 clauses, mostly within one domain, sometimes mixing two; deterministic."""
    rng = random.Random(seed)
    found: list[str] = []
    seen = set(exclude)
    while len(found) < n:
        home = rng.choice(DOMAINS)
        clauses = []
        for _ in range(rng.choice((1, 1, 2, 2, 3))):
            subjects, verbs, objects, tails = home if rng.random() < 0.85 else rng.choice(DOMAINS)
            clauses.append(f"{rng.choice(subjects)} {rng.choice(verbs)} {rng.choice(objects)} {rng.choice(tails)}.")
        text = " ".join(clauses)
        if text not in seen:
            seen.add(text)
            found.append(text)
    return found


def normalised(rows: np.ndarray) -> np.ndarray:
    out: np.ndarray = (rows / np.linalg.norm(rows, axis=1, keepdims=True)).astype(np.float32)
    return out


def clustered(real: np.ndarray, n: int, rng: np.random.Generator, sigma: tuple[float, float] = (0.01, 0.04),
              blend: float = 0.3) -> np.ndarray:
    """n synthetic unit vectors around the real ones: a real vector (or, with probability `blend`, a random
    mix of two) plus gaussian noise whose per-dimension sigma is drawn per vector from `sigma`.

    At sigma 0.01-0.04 in 384 dims the noise norm is 0.2-0.8, so a child keeps cosine ~0.78-0.98 to its
    centroid: tight and loose clusters, no duplicates. The range is chosen so the median cosine to a
    vector's nearest neighbour in the table (~0.86) matches that of the real MiniLM vectors among
    themselves (~0.87, see `nearest_neighbour_cosine`); at 0.02-0.06 it fell to ~0.76: neighbourhoods
    looser than real text has, and an HNSW graph harder to navigate than real data would make it."""
    out = np.empty((n, real.shape[1]), dtype=np.float32)
    for start in range(0, n, 20_000):
        m = min(20_000, n - start)
        first = real[rng.integers(0, len(real), m)]
        second = real[rng.integers(0, len(real), m)]
        mix = np.where(rng.random(m) < blend, rng.uniform(0.3, 0.7, m), 1.0).astype(np.float32)[:, None]
        centres = mix * first + (1.0 - mix) * second
        noise = rng.standard_normal((m, real.shape[1]), dtype=np.float32)
        noise *= rng.uniform(*sigma, m).astype(np.float32)[:, None]
        out[start:start + m] = normalised(normalised(centres) + noise)
    return out


def noisy_copies(vectors: np.ndarray, rng: np.random.Generator, sigma: float = 0.03) -> np.ndarray:
    """Queries that are near, but not on, a real text's vector (a paraphrase, roughly)."""
    return normalised(vectors + sigma * rng.standard_normal(vectors.shape, dtype=np.float32))


def nearest_neighbour_cosine(sample_from: np.ndarray, among: np.ndarray, rng: np.random.Generator,
                             n: int = 400) -> float:
    """Median cosine from a sample of `sample_from` to its nearest other vector in `among` (a subset)."""
    picked = sample_from[rng.choice(len(sample_from), min(n, len(sample_from)), replace=False)]
    sims = np.partition(picked @ among.T, -2, axis=1)
    return float(np.median(sims[:, -2]))  # the largest is the vector itself


BIG_SCOPE = "bench:big"


def small_scope(i: int) -> str:
    return f"bench:small-{i:03d}"


def mid_scope(size: int) -> str:
    return f"bench:mid-{size}"


@dataclass(frozen=True)
class Layout:
    """Which scope each vector row goes to: one big scope, optional mid-size scopes (one of each size in
    `mid`), then `small_count` scopes of `small_size`."""

    big: int
    small_count: int
    small_size: int
    mid: tuple[int, ...] = ()

    @property
    def total(self) -> int:
        return self.big + sum(self.mid) + self.small_count * self.small_size

    @staticmethod
    def for_total(total: int, big_share: float = 0.5, small_count: int = 100, mid: tuple[int, ...] = ()) -> Layout:
        """200,000 -> one scope of 100,000 and 100 of 1,000 (the issue's layout), scaled for smaller runs.
        Mid-size scopes are carved out of the big scope's share (200,000 with mid 5k, 10k, 30k -> one of
        55,000, one each of 5,000, 10,000 and 30,000, 100 of 1,000), so the small scopes and the total stay."""
        big = int(total * big_share)
        if sum(mid) >= big:
            raise ValueError(f"mid-size scopes of {sum(mid):,} rows leave no big scope in {big:,}")
        return Layout(big - sum(mid), small_count, (total - big) // small_count, tuple(mid))

    def scopes(self) -> list[str]:
        return [BIG_SCOPE] * self.big + [mid_scope(m) for m in self.mid for _ in range(m)] + [
            small_scope(i) for i in range(self.small_count) for _ in range(self.small_size)]


def assemble(real: np.ndarray, layout: Layout, rng: np.random.Generator) -> tuple[np.ndarray, list[str]]:
    """All vectors and their scopes: real vectors spread over both kinds of scope (each row position is
    random), the rest clustered synthetic; rows in random order, as scopes interleave in a live ledger."""
    total = layout.total
    if len(real) > total:
        raise ValueError("more real vectors than rows")
    vectors = np.concatenate([real, clustered(real, total - len(real), rng)])
    scopes = layout.scopes()
    return vectors[rng.permutation(total)], [scopes[j] for j in rng.permutation(total)]


_ROW_COUNT = struct.pack("!h", 7)
_TEXT_LEN = struct.Struct("!i").pack
_INT4 = struct.pack("!ii", 4, 1)  # version_sequence = 1
_INT8 = struct.Struct("!iq").pack
_FALSE = struct.pack("!ib", 1, 0)


def _text(value: str) -> bytes:
    data = value.encode()
    return _TEXT_LEN(len(data)) + data


def copy_chunks(vectors: np.ndarray, scopes: list[str], start: int = 0, stop: int | None = None,
                chunk: int = 5_000) -> Iterator[bytes]:
    """Binary COPY payload of rows [start, stop) for (scope_id, object_id, version_id, version_sequence,
    ledger_sequence, truncated, embedding): header, tuples in chunks, trailer. pgvector's binary form is
    int16 dimensions, int16 unused, then big-endian float4s."""
    stop = len(vectors) if stop is None else stop
    dims = vectors.shape[1]
    vector_head = struct.pack("!ihh", 4 + 4 * dims, dims, 0)
    big_endian = vectors.astype(">f4")
    yield HEADER
    for base in range(start, stop, chunk):
        parts: list[bytes] = []
        for i in range(base, min(stop, base + chunk)):
            parts += (_ROW_COUNT, _text(scopes[i]), _text(f"obj-{i:07d}"), _text(f"ver-{i:07d}"), _INT4,
                      _INT8(8, i + 1), _FALSE, vector_head, big_endian[i].tobytes())
        yield b"".join(parts)
    yield TRAILER


def object_index(object_id: str) -> int:
    return int(object_id.removeprefix("obj-"))
