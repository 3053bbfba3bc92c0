-- [E1] Vectors kept per version (embedding/store.py): beside each space's `embedding_vectors_<key>` (one row per
-- object, overwritten by newer versions, HNSW), `embedding_vectors_<key>_kept` holds one row per (scope, object,
-- content digest), written once, never updated, deleted only by an erasure of its object; search at a sealed
-- snapshot ranks the versions at its watermark by these. New spaces get the table with their vector table
-- (embedding.store.create_space); here, every space registered before this migration gets it, filled with
-- the vectors its live table holds now (older versions' vectors were overwritten before this table existed:
-- a snapshot sealed at a watermark whose versions were superseded before this migration misses them).
DO $$
DECLARE
    s record;
BEGIN
    FOR s IN SELECT space_key, dimensions FROM embedding_spaces ORDER BY space_key LOOP
        EXECUTE format('CREATE TABLE IF NOT EXISTS %I (scope_id text NOT NULL, object_id text NOT NULL,'
                       ' content_digest text NOT NULL, version_id text NOT NULL, ledger_sequence bigint NOT NULL,'
                       ' embedding vector(%s) NOT NULL, PRIMARY KEY (scope_id, object_id, content_digest))',
                       'embedding_vectors_' || s.space_key || '_kept', s.dimensions);
        EXECUTE format('INSERT INTO %I (scope_id, object_id, content_digest, version_id, ledger_sequence, embedding)'
                       ' SELECT scope_id, object_id, content_digest, version_id, ledger_sequence, embedding FROM %I'
                       ' WHERE content_digest IS NOT NULL ON CONFLICT DO NOTHING',
                       'embedding_vectors_' || s.space_key || '_kept', 'embedding_vectors_' || s.space_key);
    END LOOP;
END $$;
