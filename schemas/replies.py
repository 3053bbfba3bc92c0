"""Reply rendering and header names: the bytes every service answers with, defined once.

Why here: the writer, the query service and the Subscribe gateway all answer with these shapes (the
PAMSPEC error envelope, the committed envelope, a command's result), and a client in any language reads
them; pure bytes, no I/O.
"""

from __future__ import annotations

import uuid
from typing import Any, Protocol

import msgspec

from schemas.canonical import canonical_bytes
from schemas.common import is_valid_id
from schemas.errors import PamledgerError

from pamledger_client.protocol.headers import (  # the header names are the protocol's: the SDK sends them
    ACTOR_HEADER as ACTOR_HEADER,
    IDEMPOTENCY_HEADER as IDEMPOTENCY_HEADER,
    OPERATION_HEADER as OPERATION_HEADER,
)


class Head(Protocol):
    """What a success reply needs of the version a command committed."""

    @property
    def object_id(self) -> str: ...
    @property
    def version_id(self) -> str: ...
    @property
    def sequence(self) -> int: ...
    @property
    def meta(self) -> dict[str, Any]: ...


def error_reply(error: PamledgerError, operation_id: str | None) -> bytes:
    """The wire form of a failure: {"error": <PAMSPEC error envelope>}. An operation id that is not a valid
    id (it may be the very input being refused) is not echoed: the reply gets a fresh one."""
    if operation_id is None or not is_valid_id(operation_id):
        operation_id = f"op:{uuid.uuid4()}"
    return canonical_bytes({"error": error.envelope(operation_id)})


def result_bytes(head: Head, ledger_sequence: int, event_id: str, content: bytes | None,
                 extra: dict[str, Any] | None = None) -> bytes:
    """The success reply: ids, sequences and the committed envelope in canonical bytes (a Relationship
    Version's id is `relationship_id`); `extra` adds an operation's own fields (a promotion's links)."""
    return canonical_bytes({"result": {
        id_field(head.meta): head.object_id,
        "version_id": head.version_id,
        "sequence": head.sequence,
        "ledger_sequence": ledger_sequence,
        "event_id": event_id,
        "envelope": msgspec.Raw(envelope_bytes(head.meta, content)),
        **(extra or {}),
    }})


def id_field(meta: dict[str, Any]) -> str:
    """What a version's id is called on the wire: relationship_id for a Relationship Version, else object_id."""
    return "relationship_id" if "relationship_id" in meta else "object_id"


def entry_result_bytes(ledger_sequence: int, event_id: str, replayed: bool = False) -> bytes:
    """The success reply of an event-only entry (no object, no version); `replayed` marks an idempotent
    replay of it."""
    result: dict[str, Any] = {"ledger_sequence": ledger_sequence, "event_id": event_id}
    if replayed:
        result["idempotency_result"] = "replayed_original_result"
    return canonical_bytes({"result": result})


def envelope_bytes(meta: dict[str, Any], content: bytes | None) -> bytes:
    """A version's canonical envelope: its metadata plus content (tombstone marker, or null once erased)."""
    return canonical_bytes({**meta, "canonical_content": _shown(meta.get("availability_state") == "deleted", content)})


def stored_envelope_bytes(meta: bytes, content: bytes | None) -> tuple[bytes, bool]:
    """envelope_bytes from the version's stored metadata bytes (canonical), its fields left undecoded: the same
    bytes at a fraction of the cost, for a caller that renders many (export); and whether it is a deletion."""
    fields = _stored_meta.decode(meta)
    deleted = bytes(fields.get("availability_state", b"")) == b'"deleted"'
    return canonical_bytes({**fields, "canonical_content": _shown(deleted, content)}), deleted


_stored_meta = msgspec.json.Decoder(dict[str, msgspec.Raw])
_TOMBSTONE = msgspec.Raw(canonical_bytes({"tombstone": True}))


def _shown(deleted: bool, content: bytes | None) -> msgspec.Raw:
    return _TOMBSTONE if deleted else msgspec.Raw(content if content is not None else b"null")
