"""Synthetic memory content of the bulk-loaded ledger: short English sentences from a fixed vocabulary.

The loader writes claims, observations, decisions … whose content is a few varied sentences, so full
text has something to find; the query benchmark draws its search words from the same vocabulary
(`COMMON_WORDS`), so every text query hits a realistic share of each scope.
"""

from __future__ import annotations

import functools
import random
from typing import Any

NOUNS = (
    "server", "invoice", "customer", "river", "database", "contract", "shipment", "meeting", "report",
    "budget", "sensor", "garden", "library", "engine", "forecast", "ticket", "migration", "network",
    "payment", "warehouse", "patient", "vaccine", "satellite", "harvest", "bridge", "camera", "policy",
    "election", "museum", "recipe",
)
VERBS = (
    "delayed", "approved", "reviewed", "monitored", "repaired", "reported", "scheduled", "rejected",
    "measured", "updated", "archived", "inspected", "flagged", "confirmed", "exported",
)
ADJECTIVES = (
    "quarterly", "urgent", "northern", "encrypted", "broken", "seasonal", "remote", "legacy", "private",
    "weekly", "critical", "green", "noisy", "expensive", "fragile",
)
PLACES = (
    "the main office", "Berlin", "the data center", "the north warehouse", "the hospital", "the harbor",
    "the lab", "the city council", "Lisbon", "the night shift",
)
TEMPLATES = (
    "The {adj} {noun} was {verb} by the team in {place}.",
    "Our {noun} team {verb} the {adj} {noun2} last week.",
    "A {adj} {noun} near {place} must be {verb} before Friday.",
    "Customers said the {noun} and the {noun2} were {verb} too late.",
    "Nobody expected the {noun} in {place} to be {verb} so quickly.",
    "According to the {adj} report, the {noun2} is {verb} every morning.",
    "The {noun2} depends on the {adj} {noun}, which was {verb} yesterday.",
    "After the storm, the {noun} at {place} was {verb} and the {noun2} stayed {adj}.",
)
# Query words: nouns and verbs (never stop words in the 'english' configuration).
COMMON_WORDS = NOUNS + VERBS

OBJECT_TYPES = ("claim", "observation", "decision", "task", "summary", "entity")
TYPE_WEIGHTS = (50, 15, 10, 10, 10, 5)
POOL_SIZE = 8192


def sentence(rng: random.Random) -> str:
    noun, noun2 = rng.sample(NOUNS, 2)
    return rng.choice(TEMPLATES).format(adj=rng.choice(ADJECTIVES), noun=noun, noun2=noun2,
                                        verb=rng.choice(VERBS), place=rng.choice(PLACES))


@functools.lru_cache(maxsize=4)
def sentence_pool(seed: int) -> tuple[str, ...]:
    """POOL_SIZE sentences, the same for one seed in every process."""
    rng = random.Random(seed)
    return tuple(sentence(rng) for _ in range(POOL_SIZE))


class ContentMaker:
    """Fast content from a pool of distinct sentences (generation must keep up with a 20k events/s load)."""

    def __init__(self, rng: random.Random, seed: int):
        self.rng = rng
        self.pool = sentence_pool(seed)
        self.types = [t for t, w in zip(OBJECT_TYPES, TYPE_WEIGHTS) for _ in range(w)]

    def _pick(self) -> str:
        return self.pool[int(self.rng.random() * POOL_SIZE)]

    def paragraph(self, low: int = 2, high: int = 4) -> str:
        return " ".join(self._pick() for _ in range(low + int(self.rng.random() * (high - low + 1))))

    def object_type(self) -> str:
        return self.types[int(self.rng.random() * len(self.types))]

    def content(self, object_type: str) -> dict[str, Any]:
        """Canonical content of one version (the standard types used here take free-form content)."""
        rng = self.rng
        if object_type == "claim":
            return {"text": self.paragraph(), "confidence": round(rng.random(), 2)}
        if object_type == "task":
            return {"title": self._pick(), "status": ("open", "blocked", "done")[int(rng.random() * 3)]}
        if object_type == "entity":
            name = NOUNS[int(rng.random() * len(NOUNS))].title() + " " + str(int(rng.random() * 999) + 1)
            return {"name": name, "description": self.paragraph(1, 2)}
        return {"text": self.paragraph(), "tags": [NOUNS[int(rng.random() * len(NOUNS))]]}


def search_text(rng: random.Random) -> str:
    """One or two common words (two words are an AND query in websearch syntax)."""
    return " ".join(rng.sample(COMMON_WORDS, rng.choice((1, 1, 2))))
