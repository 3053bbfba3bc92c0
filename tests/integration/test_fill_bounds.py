"""A fill covers what was current at its start and leaves later versions to the live follower.

Why: under load the fill used to walk `current_objects` in key order while creates kept landing ahead of its
cursor, so it chased the load until it ended and embedded every object a second time (the follower embeds
every version after the space's registration anyway). The fill reads the indexer's own catalog, which the
follower writes with its checkpoint: the test plays the follower up to the first object.
"""

from __future__ import annotations

import psycopg
from psycopg import sql
from psycopg.types import TypeInfo

from embedding.embedders import FeatureHashingEmbedder
from embedding.store import INDEX_CHECKPOINT, create_space
from indexer.catalog import apply_catalog
from indexer.plan import plan_batch
from indexer.rebuild import fill_space
from infra.projections import advance_checkpoint
from schemas.embedding import encode_space, space_digest
from tests.conftest import ACTOR, PROVENANCE, Env, serving

SCOPE = "workspace:fill-bounds"


async def test_objects_current_after_the_fill_start_are_left_to_the_follower(env: Env) -> None:
    async with serving(env) as client:  # no indexer: the test plays its part
        await client.create_scope(SCOPE)
        made = [await client.create(SCOPE, "claim", {"statement": f"fact {i}"}, ACTOR, PROVENANCE) for i in range(3)]
        last = made[-1]["ledger_sequence"]
        async with await psycopg.AsyncConnection.connect(env.database_url, autocommit=True) as conn:
            embedder = FeatureHashingEmbedder(12)
            space = embedder.descriptor
            start = made[0]["ledger_sequence"]
            row = await create_space(conn, space, encode_space(space), space_digest(space), start)
            assert row is not None
            async with conn.transaction():  # the follower has reached the first object
                events = await (await conn.execute(
                    "SELECT ledger_sequence, event FROM ledger WHERE ledger_sequence <= %s ORDER BY 1",
                    (start,))).fetchall()
                await apply_catalog(conn, plan_batch([(int(r[0]), bytes(r[1])) for r in events]))
                await advance_checkpoint(conn, INDEX_CHECKPOINT, start)
            assert last > start  # two objects current only after the start: left to the follower
            # Another library on the same connection knowing the vector type must not stop ours from sending
            # vectors in binary (embedding.vector_wire checks its own dumper, not the type's name).
            info = await TypeInfo.fetch(conn, "vector")
            assert info is not None
            info.register(conn)
            report = await fill_space(conn, row, embedder)
            assert (report.filled_sequence, report.total, report.embedded) == (start, 1, 1)
            cur = await conn.execute(sql.SQL("SELECT object_id FROM {}").format(row.table))
            assert [r[0] for r in await cur.fetchall()] == [made[0]["object_id"]]
