"""Turning a NATS message into a typed command, or into the error that answers it."""

from __future__ import annotations

import hashlib
import re
import uuid
from typing import Any

import msgspec

from schemas.canonical import canonical_bytes
from schemas.commands import DECODERS, Command, CreateScope
from schemas.common import is_valid_id
from schemas.errors import InvalidObject, InvalidRequest, PamledgerError

# A value that breaks the object model inside the envelope (as opposed to a malformed command) is
# invalid_object, e.g. quality_signals.assessed_confidence = 1.5.
_ENVELOPE_PATH = re.compile(
    r"at `\$\.(actor|provenance|integrity|quality_signals|relationship_refs|schema_id|observed_at|asserted_at"
    r"|valid_from|valid_until)\b"
)
IDEMPOTENCY_HEADER = "Pam-Idempotency-Key"
OPERATION_HEADER = "Pam-Operation-Id"


class Parsed(msgspec.Struct, frozen=True, kw_only=True):
    """A decoded command with the facts the writer needs about it."""

    name: str
    command: Command
    operation_id: str | None
    idempotency_key: str | None
    request_digest: str

    @property
    def scope_id(self) -> str:
        return self.command.scope_id


def parse(name: str, data: bytes, headers: dict[str, str] | None, max_bytes: int) -> Parsed:
    """Decode and check one command; raises InvalidRequest for anything malformed."""
    if len(data) > max_bytes:
        raise InvalidRequest(
            f"payload of {len(data)} bytes exceeds the limit of {max_bytes}",
            details={"limit_bytes": max_bytes, "size_bytes": len(data)},
        )
    decoder = DECODERS.get(name)
    if decoder is None:
        raise InvalidRequest(f"unknown command {name!r}", details={"command": name})
    try:
        command = decoder.decode(data)
    except msgspec.ValidationError as exc:
        error = InvalidObject if _ENVELOPE_PATH.search(str(exc)) else InvalidRequest
        raise error(f"invalid {name} command: {exc}", details={"reason": str(exc)}) from None
    except msgspec.DecodeError as exc:
        raise InvalidRequest(f"malformed {name} command: {exc}", details={"reason": str(exc)}) from None
    headers = headers or {}
    key = _idempotency_key(command, headers)
    operation_id = headers.get(OPERATION_HEADER) or getattr(command, "operation_id", None)
    if operation_id is not None and not is_valid_id(operation_id):
        raise InvalidRequest("operation id must follow the scheme:rest id pattern", details={"operation_id": operation_id})
    return Parsed(
        name=name,
        command=command,
        operation_id=operation_id,
        idempotency_key=key,
        request_digest=request_digest(command),
    )


def request_digest(command: Command) -> str:
    """What 'the same request' means for idempotency: the command minus its key and operation id."""
    if isinstance(command, CreateScope):
        return ""
    plain: dict[str, Any] = msgspec.to_builtins(command)
    plain.pop("idempotency_key", None)
    plain.pop("operation_id", None)
    return hashlib.sha256(canonical_bytes(plain)).hexdigest()


def _idempotency_key(command: Command, headers: dict[str, str]) -> str | None:
    in_body = getattr(command, "idempotency_key", None)
    in_header = headers.get(IDEMPOTENCY_HEADER)
    if in_body and in_header and in_body != in_header:
        raise InvalidRequest(
            "idempotency key differs between header and payload",
            details={"header": in_header, "payload": in_body},
        )
    return in_header or in_body


def error_reply(error: PamledgerError, operation_id: str | None) -> bytes:
    """The wire form of a failure: {"error": <PAMSPEC error envelope>}."""
    return canonical_bytes({"error": error.envelope(operation_id or f"op:{uuid.uuid4()}")})
