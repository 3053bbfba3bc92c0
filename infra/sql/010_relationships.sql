-- [M5] The current-relationship projection (disposable: the projector writes it in the same transaction and
-- checkpoint as current_objects, `pamledger replay` rebuilds it byte-identically from the ledger). One row per
-- Relationship Object: its latest version. `target_scope_id` is the target's scope, never NULL: the envelope's
-- target_scope_id for a cross-scope relationship, else the relationship's own scope_id (`meta` keeps the
-- envelope exactly as committed). Query by relationship (query.related) reads it; it grants nothing: every
-- step of a traversal is still checked against the caller's grants.

CREATE TABLE current_relationships (
    scope_id           text        NOT NULL,
    relationship_id    text        NOT NULL,
    version_id         text        NOT NULL,
    sequence           integer     NOT NULL,
    ledger_sequence    bigint      NOT NULL,
    relationship_type  text        NOT NULL,
    source_object_id   text        NOT NULL,
    target_scope_id    text        NOT NULL,
    target_object_id   text        NOT NULL,
    directionality     text        NOT NULL,
    lifecycle_state    text        NOT NULL,
    availability_state text        NOT NULL,
    retention_state    text        NOT NULL,
    validation_state   text        NOT NULL,
    actor_id           text        NOT NULL,
    committed_at       timestamptz NOT NULL,
    content_digest     text,
    meta               bytea       NOT NULL,
    PRIMARY KEY (scope_id, relationship_id)
);
-- Neighbours: edges leaving an object (stored in its scope), edges arriving at one (from any scope).
CREATE INDEX current_relationships_source_idx ON current_relationships (scope_id, source_object_id, relationship_type);
CREATE INDEX current_relationships_target_idx ON current_relationships (target_scope_id, target_object_id, relationship_type);
