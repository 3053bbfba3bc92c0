"""PostgreSQL binary COPY encoding of the ledger tables' rows, so loader workers ship ready-to-send bytes.

Format (PostgreSQL docs, "COPY ... BINARY"): an 11-byte signature, int32 flags, int32 header-extension
length; per tuple an int16 field count and per field an int32 length (-1 for NULL) and the value in the
type's binary send format (int4/int8 big-endian, text UTF-8, bytea raw, timestamptz int64 microseconds
since 2000-01-01 UTC); an int16 -1 trailer. One hand-unrolled encoder per table keeps this fast.
"""

from __future__ import annotations

import struct
from datetime import datetime, timezone
from typing import Any

HEADER = b"PGCOPY\n\xff\r\n\x00" + struct.pack("!ii", 0, 0)
TRAILER = struct.pack("!h", -1)
_EPOCH = datetime(2000, 1, 1, tzinfo=timezone.utc)
_NULL = struct.pack("!i", -1)
_LEN = struct.Struct("!i").pack
_INT4 = struct.Struct("!ii").pack  # length 4, value
_INT8 = struct.Struct("!iq").pack  # length 8, value
_COUNT = {n: struct.pack("!h", n) for n in (5, 7, 12)}


def _text(value: str | None) -> bytes:
    if value is None:
        return _NULL
    data = value.encode()
    return _LEN(len(data)) + data


def bytea(value: bytes) -> bytes:
    return _LEN(len(value)) + value


def _timestamptz(value: datetime) -> bytes:
    delta = value - _EPOCH
    return _INT8(8, (delta.days * 86_400 + delta.seconds) * 1_000_000 + delta.microseconds)


def ledger_prefix(row: tuple[Any, ...]) -> bytes:
    """(partition, ledger_sequence, event_id, operation_id, scope_id, object_id, version_id, event_type,
    recorded_at, event): the first 10 of the ledger's 12 COPY fields; prev_hash and row_hash follow."""
    partition, seq, event_id, operation_id, scope_id, object_id, version_id, event_type, recorded_at, event = row
    return b"".join((_COUNT[12], _INT4(4, partition), _INT8(8, seq), _text(event_id), _text(operation_id),
                     _text(scope_id), _text(object_id), _text(version_id), _text(event_type),
                     _timestamptz(recorded_at), _LEN(len(event)), event))


def version_tuple(row: tuple[Any, ...]) -> bytes:
    """(scope_id, object_id, sequence, version_id, ledger_sequence, meta, content_digest)."""
    scope_id, object_id, sequence, version_id, seq, meta, digest = row
    return b"".join((_COUNT[7], _text(scope_id), _text(object_id), _INT4(4, sequence), _text(version_id),
                     _INT8(8, seq), _LEN(len(meta)), meta, _text(digest)))


def content_tuple(row: tuple[Any, ...]) -> bytes:
    """(content_digest, scope_id, object_id, salt, content)."""
    digest, scope_id, object_id, salt, content = row
    return b"".join((_COUNT[5], _text(digest), _text(scope_id), _text(object_id), _LEN(len(salt)), salt,
                     _LEN(len(content)), content))


def table_bytes(tuples: list[bytes]) -> bytes:
    """A complete COPY FROM STDIN (FORMAT BINARY) payload: header, tuples, trailer."""
    return b"".join([HEADER, *tuples, TRAILER])
