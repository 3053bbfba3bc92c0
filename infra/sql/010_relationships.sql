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

-- Backfill. Before this table the projector skipped relationship events, so its checkpoint may already be past
-- relationships the ledger holds. Each one's row is a function of its latest version, which memory_versions
-- holds with the same envelope bytes as its event (`pamledger verify` checks that), its ledger sequence and
-- content digest: the rows below are the ones the projector would have written. Versions committed after this
-- runs reach the table through the projector (its upsert never replaces a row by an older or equal one).
-- BACKFILL
INSERT INTO current_relationships
SELECT DISTINCT ON (v.scope_id, v.object_id)
       v.scope_id, v.object_id, v.version_id, v.sequence, v.ledger_sequence, m->>'relationship_type',
       m->>'source_object_id', coalesce(m->>'target_scope_id', m->>'scope_id'), m->>'target_object_id',
       m->>'directionality', m->>'lifecycle_state', m->>'availability_state', m->>'retention_state',
       m->>'validation_state', m->'actor'->>'actor_id', (m->>'committed_at')::timestamptz, v.content_digest, v.meta
FROM memory_versions v CROSS JOIN LATERAL (SELECT convert_from(v.meta, 'UTF8')::jsonb AS m) j
WHERE m ? 'relationship_id'
ORDER BY v.scope_id, v.object_id, v.sequence DESC;
