"""The SDK's push subscription re-attaches when a gateway that took over pushes under older generations.

Why: a gateway that takes over (its leader SIGKILLed) starts each subscription's generation at 1 again, while
an SDK that had resumed before holds a higher one; every push and keepalive then looked stale and, never
quiet, the subscription waited forever (found by `make soak`). A stale keepalive now makes it resume.
"""

from __future__ import annotations

from typing import Any

import msgspec

from pamledger_client.subscription import Subscription


class Gateway:
    """Answers `resume` with the generation a gateway that took over would (the SDK's requests, recorded)."""

    def __init__(self, generation: int):
        self.generation = generation
        self.requests: list[tuple[str, dict[str, Any]]] = []

    async def subscription_request(self, name: str, body: dict[str, Any], actor: Any = None) -> dict[str, Any]:
        self.requests.append((name, body))
        return {"generation": self.generation}


def opened(generation: int) -> dict[str, Any]:
    return {"subscription_id": "sub:1", "delivery_subject": "_INBOX.x", "start_sequence": 10,
            "generation": generation}


async def test_a_keepalive_of_an_older_generation_makes_it_resume() -> None:
    gateway = Gateway(generation=2)
    sub = Subscription(gateway, opened(generation=3), 2000)  # type: ignore[arg-type]
    keepalive = {"type": "keepalive", "subscription_id": "sub:1", "generation": 1, "last_delivered_sequence": 10}
    assert await sub._accept(keepalive) is None
    assert gateway.requests == [("resume", {"subscription_id": "sub:1", "after_sequence": 10,
                                            "delivery_subject": "_INBOX.x"})]
    assert sub.generation == 2
    event = {"type": "event", "generation": 2, "ledger_sequence": 11, "previous_sequence": 10, "event": {}}
    accepted = await sub._accept(msgspec.json.decode(msgspec.json.encode(event)))
    assert accepted is not None and accepted["ledger_sequence"] == 11


async def test_an_event_of_an_older_generation_is_still_dropped_without_a_resume() -> None:
    gateway = Gateway(generation=4)
    sub = Subscription(gateway, opened(generation=3), 2000)  # type: ignore[arg-type]
    event = {"type": "event", "generation": 2, "ledger_sequence": 11, "previous_sequence": 10, "event": {}}
    assert await sub._accept(event) is None
    assert gateway.requests == [] and sub.generation == 3
