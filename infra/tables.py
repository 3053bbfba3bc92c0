"""Who owns each table: the one module whose SQL creates its rows and reads them, and who else may read it.

Why as data: services meet where no import rule looks, in SQL strings. A table's owner is the only module
that writes it; a module outside the owner that needs its rows calls the owner's functions, or reads a read
model declared here on purpose, with the reason next to the reader. `tests/unit/test_table_owners.py` fails
when SQL in a module that is neither names a table, and when a table the migrations create is missing here.
The migrations (`infra/sql/*.sql`) create every table; they are the schema, not an owner.

A reader is a module (`query.reads`) or a whole package (`query`: every module in it).
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class Table:
    owner: str
    readers: dict[str, str] = field(default_factory=dict)  # module or package -> why it reads the table


_WRITER_READS = {
    "command_handler.store_reads": "the writer's own reads, beside its append (split out for size)",
    "command_handler.verify": "verify checks every row of the writer's tables against the chain",
}
_VERSION_STORE = {
    "query": "read, history and every answer's envelope and content come from the version store",
    "indexer.texts": "the text an embedding is made of",
    "authz.registry": "actors and credentials are versioned objects of the system scope",
    "embedding.store": "a vector is written only while its version's content still exists",
}
_VACUUM = {"pamledger.cli_scrub": "scrub vacuums the tables erased content passed through (names only)"}
_PROJECTION_READERS = {
    "query": "the projection is the query service's read model",
    "retention.evaluator": "retention finds expired objects by their current state",
    "projector.replay_diagnosis": "replay's diagnosis compares a rebuilt projection with the live one",
}

TABLES: dict[str, Table] = {
    "ledger": Table("command_handler.store", {
        **_WRITER_READS,
        "infra.ledger": "the kernel's read side of the ledger: head, idempotent replays, history",
        "infra.ledger_identity": "the identity check compares a ledger row with the stream's",
        "projector.replay": "replay rebuilds the projection from the ledger",
        "projector.replay_diagnosis": "replay's diagnosis re-reads the events of a disagreement",
        "query.reads": "history and the scope's event list are ledger reads",
        "query.export": "an export is the scope's ledger entries with their versions",
        "query.plan": "a query at a past sequence rebuilds only the objects with ledger entries after it",
        "query.snapshots": "content a snapshot lost since its seal is lost by a later entry of its object",
        "query.snapshot_diff": "a snapshot diff shows a changed object's ledger events between two watermarks",
        "query.snapshots": "what a snapshot lost since its seal: only objects with entries after its watermark",
        "query.plan": "at a snapshot, objects with entries after its watermark are read from their versions",
        "retention.evaluator": "an object's age is its first version's commit time",
        "infra.partitions": "a ledger that holds rows before its partition count was recorded had one",
    }),
    "memory_versions": Table("command_handler.store", {
        **_WRITER_READS, **_VERSION_STORE,
        "projector.audit": "an audit at sequence N shows the versions current at N",
        "retention.evaluator": "an object's first version",
        "infra.ledger": "latest_version: the object's newest version, whose availability every read tests",
    }),
    "content_store": Table("command_handler.store", {**_WRITER_READS, **_VERSION_STORE, **_VACUUM,
                                                     "projector.store": "the full-text vector of a version"}),
    "idempotency_records": Table("command_handler.store", {**_WRITER_READS, **_VACUUM}),
    "delegations": Table("command_handler.store", {
        **_WRITER_READS,
        "subscriptions.store": "the gateway closes subscriptions whose delegation was revoked or ended",
    }),
    "evaluation_snapshots": Table("command_handler.store", {
        **_WRITER_READS, "query.snapshots": "reads at a snapshot, and list/show, find its sealed descriptor by id",
    }),
    "evaluation_runs": Table("command_handler.store", {
        **_WRITER_READS,
        "query.evaluation": "reads through an evaluation scope (and its diff) find its run's snapshot (the fork)",
    }),
    "scopes": Table("command_handler.store", {
        "command_handler.store_reads": _WRITER_READS["command_handler.store_reads"],
        "command_handler.verify": "a partition's rows of the other tables are those of the scopes created in it",
        "infra.scopes": "the kernel's scope reads: whether a scope exists, its record, policies by key",
        "retention.evaluator": "an object's first ledger row is in its scope's recorded partition",
    }),
    "ledger_identity": Table("infra.ledger_identity"),
    "ledger_layout": Table("infra.partitions"),
    "projection_checkpoints": Table("infra.projections", {
        "infra.ledger_identity": "a follower's checkpoint must be this ledger's",
        "projector.replay": "replay --swap moves the checkpoint with the tables",
    }),
    "current_objects": Table("projector.store", {
        **_PROJECTION_READERS, **_VACUUM,
        "infra.projections": "the projection's name is its checkpoint's key",
    }),
    "current_relationships": Table("projector.store", {
        **{k: v for k, v in _PROJECTION_READERS.items() if k != "retention.evaluator"}, **_VACUUM,
    }),
    "subscriptions": Table("subscriptions.store"),
    "embedding_spaces": Table("embedding.store"),
    "index_outbox": Table("indexer.outbox", _VACUUM),
    "index_catalog": Table("indexer.catalog"),
    "vector_handoff": Table("embedding.handoff", _VACUUM),
}
# Tables made at run time, one per Embedding Space: `embedding_vectors_<space_key>`.
VECTOR_TABLE_PREFIX = "embedding_vectors_"
VECTOR_TABLES = Table("embedding.store")  # others name a space's table by SpaceRow.table
