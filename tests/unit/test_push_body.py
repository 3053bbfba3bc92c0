"""The gateway assembles pushed events from bytes; they must be exactly the canonical JSON."""

from __future__ import annotations

import msgspec

from schemas.canonical import canonical_bytes
from subscriptions.session import push_body


def test_the_assembled_push_is_byte_identical_to_its_canonical_encoding() -> None:
    text = 'ünï "quoted" back\\slash\nnewline'
    event = canonical_bytes({"event_type": "object_created", "payload": {"n": 1.5, "s": text},
                             "scope_id": "workspace:x"})
    sub_id = 'sub:5f1c"odd\\id'
    expected = canonical_bytes({"type": "event", "subscription_id": sub_id, "ledger_sequence": 42,
                                "previous_sequence": 40, "generation": 3, "event": msgspec.Raw(event)})
    assert push_body(msgspec.json.encode(sub_id), 42, 40, 3, event) == expected
