"""Vectors to Postgres in pgvector's binary form, not as text.

Why: the text form (`[0.0123,...]`, nine digits per float) cost the indexer a quarter of its CPU per create
to format, and Postgres as much again to parse. The binary form (`vector_send`/`vector_recv`: int16
dimensions, int16 zero, then big-endian float4s) is one numpy conversion. Vectors reach the server as one
`vector[]` parameter per statement; the connection learns the `vector` type's oids once
(`ensure_vector_adapters`).

A float64 is rounded to float4 once here (round to nearest); the text form rounded it to nine digits first,
then to float4, which may differ in the last bit on rare values. Either way the stored value is what every
search reads.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from typing import Any

import numpy as np
import psycopg
from psycopg.adapt import Dumper, PyFormat
from psycopg.pq import Format
from psycopg.types import TypeInfo

_HEADER = struct.Struct("!HH")
MAX_DIMENSIONS = 16_000  # pgvector's own limit for a vector column


class VectorBytes(bytes):
    """One vector already in pgvector's binary form (made by `vector_bytes`)."""


def vector_bytes(vector: Sequence[float]) -> VectorBytes:
    """pgvector's binary form. Refuses NaN and infinities, which no similarity can be computed from."""
    values = np.asarray(vector, dtype=np.float64)
    if values.ndim != 1 or not 0 < values.shape[0] <= MAX_DIMENSIONS:
        raise ValueError(f"a vector has 1 to {MAX_DIMENSIONS} dimensions")
    if not np.isfinite(values).all():
        raise ValueError("vector holds NaN or an infinite value")
    with np.errstate(over="ignore"):  # refused just below, not warned about
        single = values.astype(">f4")
    if not np.isfinite(single).all():
        raise ValueError("vector holds a value beyond float4")
    return VectorBytes(_HEADER.pack(values.shape[0], 0) + single.tobytes())


def vector_from_bytes(data: bytes) -> list[float]:
    """The inverse of `vector_bytes` (tests and tools)."""
    dimensions, _unused = _HEADER.unpack_from(data)
    values: list[float] = np.frombuffer(data, dtype=">f4", count=dimensions, offset=_HEADER.size).astype(float).tolist()
    return values


class _VectorDumper(Dumper):
    format = Format.BINARY

    def dump(self, obj: Any) -> bytes:
        return bytes(obj)


async def ensure_vector_adapters(conn: psycopg.AsyncConnection[Any]) -> None:
    """Teach this connection to send `VectorBytes` (and lists of them) as `vector` / `vector[]` (once)."""
    if issubclass(conn.adapters.get_dumper(VectorBytes, PyFormat.BINARY), _VectorDumper):
        return  # this connection knows already (a "vector" type registered by someone else is not enough)
    # One plain statement rather than TypeInfo.fetch, which wraps its catalog query in a savepoint: this runs
    # inside the indexer's pipelined transactions.
    cur = await conn.execute("SELECT 'vector'::regtype::oid, 'vector[]'::regtype::oid")
    row = await cur.fetchone()
    if row is None:
        raise psycopg.errors.UndefinedObject("the vector type (pgvector) is not installed in this database")
    info = TypeInfo("vector", int(row[0]), int(row[1]))
    info.register(conn)
    dumper = type("VectorDumper", (_VectorDumper,), {"oid": info.oid})
    conn.adapters.register_dumper(VectorBytes, dumper)
