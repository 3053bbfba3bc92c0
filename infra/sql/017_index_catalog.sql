-- [S2] The indexer's own catalog of what may have a vector: the current version of every live object outside
-- the system scope that has content, as of the indexer's checkpoint. Its follower writes it in the same
-- transaction as the checkpoint (indexer/catalog.py), so a fill reads what was current at its start without
-- waiting on another follower; before, the indexer read the projector's current_objects and waited on its
-- checkpoint.
CREATE TABLE index_catalog (
    scope_id        text    NOT NULL,
    object_id       text    NOT NULL,
    version_id      text    NOT NULL,
    sequence        integer NOT NULL,
    ledger_sequence bigint  NOT NULL,
    object_type     text    NOT NULL,
    content_digest  text    NOT NULL,
    PRIMARY KEY (scope_id, object_id)
);

-- An existing ledger: the catalog as the indexer's checkpoint left it, from the version store (each object's
-- latest version up to the checkpoint, when it is live and has content; what current_objects held for a fill).
INSERT INTO index_catalog (scope_id, object_id, version_id, sequence, ledger_sequence, object_type, content_digest)
SELECT scope_id, object_id, version_id, sequence, ledger_sequence, m ->> 'object_type', content_digest
FROM (
    SELECT DISTINCT ON (v.scope_id, v.object_id) v.scope_id, v.object_id, v.version_id, v.sequence,
           v.ledger_sequence, v.content_digest, convert_from(v.meta, 'UTF8')::jsonb AS m
    FROM memory_versions v
    WHERE v.ledger_sequence <= coalesce((SELECT ledger_sequence FROM projection_checkpoints
                                         WHERE projection = 'indexer'), 0)
    ORDER BY v.scope_id, v.object_id, v.sequence DESC
) latest
WHERE content_digest IS NOT NULL AND m ->> 'object_type' IS NOT NULL
  AND coalesce(m ->> 'availability_state', 'active') NOT IN ('deleted', 'redacted')
  AND scope_id <> 'system:pamledger';
