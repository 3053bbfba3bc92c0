"""Turning a NATS message into a typed command, or into the error that answers it.

Everything in the message is input: the payload (decoded, then checked for values no derived store can
hold, pamledger_client.protocol.values) and the headers (the same limits as the payload fields they stand for). A value that
breaks the object model inside the envelope or its content (pamledger_client.protocol.values.ENVELOPE_FIELDS, e.g.
quality_signals.assessed_confidence = 1.5 or a NUL in canonical_content) is invalid_object; anything else
malformed is invalid_request. Every refusal's details name the field as a JSON-pointer-ish path.
"""

from __future__ import annotations

import hashlib
import re
from typing import Any

import msgspec

from schemas.canonical import canonical_bytes
from schemas.bundle import chunk_key
from schemas.commands import DECODERS, Command, CreateScope, ImportEntries, RegisterEmbeddingSpace
from schemas.common import IDEMPOTENCY_KEY_MAX
from schemas.embedding import space_digest
from schemas.errors import InvalidObject, InvalidRequest, PamledgerError
from schemas.headers import check_header, header_operation_id
from schemas.replies import IDEMPOTENCY_HEADER
from pamledger_client.protocol.values import ENVELOPE_FIELDS, MAX_DEPTH, BadValue, check_value, nests_deeper, top_field

_MSGSPEC_PATH = re.compile(r" - at `\$(.*)`\Z")
_PATH_STEP = re.compile(r"\.([^.\[]+)|\[([^\]]*)\]")
_INF_DECODER = msgspec.json.Decoder(float_hook=float)


class Parsed(msgspec.Struct, frozen=True, kw_only=True):
    """A decoded command with the facts the writer needs about it."""

    name: str
    command: Command
    operation_id: str | None
    idempotency_key: str | None
    request_digest: str
    # Set on the access_denied entry that records a refused command: what that command is answered once
    # the entry has committed (command_handler.denials).
    refusal: PamledgerError | None = None

    @property
    def scope_id(self) -> str:
        return self.command.scope_id

    @property
    def key_scope(self) -> str:
        """The scope its idempotency record is kept in: its entry's (eval_start writes in the new evaluation
        scope, while it names, and is authorized on, the snapshot's)."""
        return str(getattr(self.command, "evaluation_scope_id", None) or self.command.scope_id)


def parse(name: str, data: bytes, headers: dict[str, str] | None, max_bytes: int) -> Parsed:
    """Decode and check one command; raises InvalidRequest or InvalidObject for anything malformed."""
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
        plain: dict[str, Any] = msgspec.to_builtins(command)
    except msgspec.ValidationError as exc:
        field = _field(str(exc), data)
        descriptor = name == "snapshot_create" and top_field(field) == "snapshot"  # a bad snapshot descriptor
        error = InvalidObject if top_field(field) in ENVELOPE_FIELDS or descriptor else InvalidRequest
        raise error(f"invalid {name} command: {exc}", details={"reason": str(exc), "field": field}) from None
    except msgspec.DecodeError as exc:
        raise InvalidRequest(f"malformed {name} command: {exc}", details={"reason": str(exc)}) from None
    except RecursionError:  # msgspec recurses per level: far past MAX_DEPTH, refused before it is walked
        raise InvalidObject(f"{name} command nests deeper than {MAX_DEPTH} levels",
                            details={"max_depth": MAX_DEPTH}) from None
    _check_values(name, data, plain)
    headers = headers or {}
    if isinstance(command, RegisterEmbeddingSpace):
        # The space id is the key and the descriptor is the request: who sends it or when does not matter.
        return Parsed(name=name, command=command, operation_id=_operation_id(command, headers),
                      idempotency_key=space_key(command.space.embedding_space_id),
                      request_digest=space_digest(command.space))
    key = _idempotency_key(command, headers)
    if isinstance(command, ImportEntries):  # a bundle's chunk is the same request whoever sends it
        fixed = chunk_key(command.bundle_digest, command.chunk)
        if key is not None and key != fixed:
            raise InvalidRequest("an import chunk's idempotency key is import:<bundle_digest>:<chunk>",
                                 details={"idempotency_key": key, "expected": fixed})
        key = fixed
    return Parsed(
        name=name,
        command=command,
        operation_id=_operation_id(command, headers),
        idempotency_key=key,
        request_digest="" if isinstance(command, CreateScope) else _digest(plain),
    )


def space_key(embedding_space_id: str) -> str:
    """The idempotency key a space's registration always has."""
    return f"embedding-space:{embedding_space_id}"


CONTENT_FIELDS = ("canonical_content", "target_canonical_content")


def _digest(plain: dict[str, Any]) -> str:
    """What 'the same request' means for idempotency: the command (already turned into builtins) minus its
    key and operation id (consumed: they are dropped). Two digests, `<whole>.<shape>`: the whole request's,
    and its shape's (everything but the content), which an erasure keeps when it forgets the whole one
    (command_handler.store.ERASED_REQUEST), so a retry is still told apart from another request."""
    plain.pop("idempotency_key", None)
    plain.pop("operation_id", None)
    shape = canonical_bytes({k: v for k, v in plain.items() if k not in CONTENT_FIELDS})
    content = canonical_bytes({k: plain[k] for k in CONTENT_FIELDS if k in plain})
    whole = hashlib.sha256(shape + b"\x00" + content).hexdigest()
    return f"{whole}.{hashlib.sha256(shape).hexdigest()}"


def _check_values(name: str, data: bytes, plain: dict[str, Any]) -> None:
    """Refuse what no derived store can hold; content and envelope values are invalid_object.

    The decoder has already refused ±Infinity (out of range), NaN, lone surrogates and raw control bytes, so
    in a decoded command NUL can only have come from a `\\u0000` escape, and nesting past MAX_DEPTH needs more
    than MAX_DEPTH + 1 opening brackets: bytes with neither (most commands) need no walk at all, and without
    the escape only depth is left to check. The full walk runs when something is there to name.
    """
    if b"\\u0000" not in data and (data.count(b"[") + data.count(b"{") <= MAX_DEPTH + 1
                                   or not nests_deeper(plain)):
        return
    try:
        check_value(plain)
    except BadValue as exc:
        error = InvalidObject if exc.code == "invalid_object" else InvalidRequest
        raise error(f"invalid {name} command: {exc}", details={"field": exc.path, "reason": exc.reason}) from None


def _idempotency_key(command: Command, headers: dict[str, str]) -> str | None:
    in_body = getattr(command, "idempotency_key", None)
    in_header = headers.get(IDEMPOTENCY_HEADER)
    if in_header:
        check_header(IDEMPOTENCY_HEADER, in_header, IDEMPOTENCY_KEY_MAX)
    if in_body and in_header and in_body != in_header:
        raise InvalidRequest(
            "idempotency key differs between header and payload",
            details={"header": in_header, "payload": in_body},
        )
    return in_header or in_body


def _operation_id(command: Command, headers: dict[str, str]) -> str | None:
    """The header's operation id, else the payload's; a header one must be a valid id like the payload's."""
    return header_operation_id(headers) or getattr(command, "operation_id", None)


def _field(message: str, data: bytes) -> str:
    """msgspec's error path (`$.a.b[0]`) as a JSON-pointer-ish path (`/a/b/0`); "/" when it names none.

    Inside free-form values msgspec cannot name object keys (`[...]`); the one error it raises there is a
    number out of range (1e999), so that rare case is located by decoding again with floats kept as ±inf.
    """
    found = _MSGSPEC_PATH.search(message)
    if found is None:
        return "/"
    field = "".join(f"/{name or index}" for name, index in _PATH_STEP.findall(found.group(1))) or "/"
    if "/..." in field:
        try:
            check_value(_INF_DECODER.decode(data))
        except BadValue as exc:
            return exc.path
        except (msgspec.DecodeError, msgspec.ValidationError, RecursionError):
            pass
    return field
