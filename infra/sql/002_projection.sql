-- [M2] The current-version projection (disposable: rebuilt from the ledger by `pamledger replay`) and
-- projector checkpoints. Rows and checkpoint commit in one transaction.

CREATE EXTENSION IF NOT EXISTS btree_gin;

CREATE TABLE current_objects (
    scope_id           text        NOT NULL,
    object_id          text        NOT NULL,
    version_id         text        NOT NULL,
    sequence           integer     NOT NULL,
    ledger_sequence    bigint      NOT NULL,
    object_type        text        NOT NULL,
    schema_id          text,
    lifecycle_state    text        NOT NULL,
    availability_state text        NOT NULL,
    retention_state    text        NOT NULL,
    validation_state   text        NOT NULL,
    actor_id           text        NOT NULL,
    provenance_id      text        NOT NULL,
    observed_at        timestamptz,
    asserted_at        timestamptz,
    valid_from         timestamptz,
    valid_until        timestamptz,
    committed_at       timestamptz NOT NULL,
    recorded_at        timestamptz NOT NULL,
    content_digest     text,
    meta               bytea       NOT NULL,
    search             tsvector,
    PRIMARY KEY (scope_id, object_id)
);
CREATE INDEX current_objects_newest_idx ON current_objects (scope_id, ledger_sequence DESC);
CREATE INDEX current_objects_type_idx ON current_objects (scope_id, object_type, ledger_sequence DESC);
CREATE INDEX current_objects_committed_idx ON current_objects (scope_id, committed_at DESC, ledger_sequence DESC);
CREATE INDEX current_objects_search_idx ON current_objects USING gin (scope_id, search);

CREATE TABLE projection_checkpoints (
    projection      text   PRIMARY KEY,
    ledger_sequence bigint NOT NULL
);
