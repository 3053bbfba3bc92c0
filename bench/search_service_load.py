"""Getting bench.search_service's objects and vectors in: claims through the writer, a space registered
through the writer, and then the indexer's job done by the bench (it runs without an indexer role).

Why bypass the indexer: it would embed each claim's text with the space's model; the search benchmark needs
search_data's clustered vectors (real MiniLM neighbourhoods) at 200,000 rows, loaded in seconds by
one COPY with the HNSW index built once afterwards, as bench/search_load does.
"""

from __future__ import annotations

import struct
import time
from collections.abc import Iterator
from typing import Any

import msgspec
import numpy as np
import psycopg
from psycopg import sql

from bench.load import ACTOR, PROVENANCE, check_result
from bench.pgcopy import HEADER, TRAILER
from embedding.known import descriptor_for
from embedding.store import create_space
from infra.requester import CommandRequester
from pamledger_client.protocol.subjects import command_subject
from schemas.common import SYSTEM_SCOPE
from schemas.embedding import encode_space, space_digest

BENCH_ACTOR = {"actor_id": "actor:bench:indexer", "actor_kind": "service"}
COLUMNS = "(scope_id, object_id, version_id, version_sequence, ledger_sequence, truncated, content_digest, embedding)"


def create_bodies(scopes: list[str], statements: list[str] | None = None) -> list[bytes]:
    """One claim per scope entry; its statement is `statements[i]` (default: a placeholder naming it)."""
    return [msgspec.json.encode({"scope_id": s, "object_type": "claim", "actor": ACTOR, "provenance": PROVENANCE,
                                 "canonical_content": {"statement": statements[i] if statements is not None
                                                       else f"bench object {i} in {s}"}})
            for i, s in enumerate(scopes)]


async def make_scopes(nc: Any, prefix: str, names: list[str]) -> None:
    for name in names:
        msg = await nc.request(command_subject(prefix, "create_scope"),
                               msgspec.json.encode({"scope_id": name, "scope_kind": "workspace"}), timeout=30)
        check_result(msg.data, b"")


async def register_default(nc: Any, prefix: str, model: str = "hashing-384") -> tuple[Any, int]:
    """Register `model`'s space through the writer and make it the default: (descriptor, its ledger sequence)."""
    space = descriptor_for(model)
    requester = CommandRequester(nc, prefix, timeout=30)
    registered = await requester.command("register_embedding_space", {
        "scope_id": SYSTEM_SCOPE, "space": msgspec.to_builtins(space), "actor": BENCH_ACTOR})
    await requester.command("record_index_event", {
        "scope_id": SYSTEM_SCOPE, "event_type": "index_rebuilt", "actor": BENCH_ACTOR,
        "payload": {"action": "default_space_set", "embedding_space_id": space.embedding_space_id},
        "idempotency_key": "bench:default-space"})
    return space, int(registered["ledger_sequence"])


def _text(value: str) -> bytes:
    data = value.encode()
    return struct.pack("!i", len(data)) + data


def copy_rows(objects: list[tuple[str, str, str, int, str]], vectors: np.ndarray) -> Iterator[bytes]:
    """Binary COPY of (scope, object, version, 1, ledger_sequence, false, digest, vector) per object."""
    dims = vectors.shape[1]
    head, big_endian = struct.pack("!ihh", 4 + 4 * dims, dims, 0), vectors.astype(">f4")
    yield HEADER
    for base in range(0, len(objects), 5_000):
        parts: list[bytes] = []
        for i in range(base, min(len(objects), base + 5_000)):
            scope, obj, ver, seq, digest = objects[i]
            parts += (struct.pack("!h", 8), _text(scope), _text(obj), _text(ver), struct.pack("!ii", 4, 1),
                      struct.pack("!iq", 8, seq), struct.pack("!ib", 1, 0), _text(digest), head,
                      big_endian[i].tobytes())
        yield b"".join(parts)
    yield TRAILER


async def load_vectors(url: str, space: Any, registered: int, vectors: np.ndarray,
                       scopes: list[str]) -> tuple[str, str, dict[str, float]]:
    """Bypass the indexer: registry row + table, then one vector per projected object. Returns (table, index)."""
    timings: dict[str, float] = {}
    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
        row = await create_space(conn, space, encode_space(space), space_digest(space), registered)
        assert row is not None
        await conn.execute("UPDATE embedding_spaces SET state = 'ready', is_default = true, filled_sequence = %s"
                           " WHERE embedding_space_id = %s", (registered, space.embedding_space_id))
        table_name, index_name = f"embedding_vectors_{row.space_key}", f"embedding_vectors_{row.space_key}_hnsw"
        cur = await conn.execute("SELECT indexdef FROM pg_indexes WHERE indexname = %s", (index_name,))
        found = await cur.fetchone()
        assert found is not None
        definition = found[0]
        # Pair each scope's vectors with its objects (both in creation order): which vector lands on which
        # object is arbitrary anyway; only the scope matters.
        cur = await conn.execute("SELECT scope_id, object_id, version_id, ledger_sequence, content_digest"
                                 " FROM current_objects ORDER BY ledger_sequence")
        by_scope: dict[str, list[tuple[str, str, str, int, str]]] = {}
        for s, o, v, seq, d in await cur.fetchall():
            by_scope.setdefault(s, []).append((s, o, v, int(seq), d))
        taken = {s: 0 for s in by_scope}
        objects = []
        for s in scopes:
            objects.append(by_scope[s][taken[s]])
            taken[s] += 1
        await conn.execute(sql.SQL("DROP INDEX {}").format(sql.Identifier(index_name)))
        began = time.perf_counter()
        async with conn.cursor() as c:
            statement = sql.SQL("COPY {} " + COLUMNS + " FROM STDIN (FORMAT BINARY)").format(row.table)
            async with c.copy(statement) as copy:
                for chunk in copy_rows(objects, vectors):
                    await copy.write(chunk)
        timings["copy_s"] = time.perf_counter() - began
        await conn.execute("SET maintenance_work_mem = '1GB'")
        await conn.execute("SET max_parallel_maintenance_workers = 1")
        began = time.perf_counter()
        await conn.execute(definition)
        timings["build_s"] = time.perf_counter() - began
        await conn.execute(sql.SQL("VACUUM ANALYZE {}").format(row.table))
        await conn.execute("VACUUM ANALYZE current_objects")
    return table_name, index_name, timings
