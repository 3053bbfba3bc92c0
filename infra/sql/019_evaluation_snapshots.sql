-- [E1] Sealed evaluation snapshots (PAMSPEC-Evaluation, schemas/snapshots.py). The writer records each one as an
-- event-only `index_rebuilt` entry (action `snapshot_sealed`) and keeps its descriptor here, by id, in the same
-- transaction, so reads at a snapshot find it in one look-up. Written once, never updated (a trigger refuses
-- UPDATE, DELETE and TRUNCATE, as for the ledger): a sealed snapshot never changes. The ledger stays the source
-- of truth: each row is its entry's descriptor, and `pamledger verify` compares them.
CREATE TABLE evaluation_snapshots (
    snapshot_id     text   PRIMARY KEY,
    scope_id        text   NOT NULL,
    ledger_sequence bigint NOT NULL,  -- of the entry that sealed it
    descriptor      bytea  NOT NULL   -- evaluation-snapshot.schema.json, canonical JSON
);
CREATE INDEX evaluation_snapshots_by_scope ON evaluation_snapshots (scope_id, ledger_sequence);
CREATE TRIGGER evaluation_snapshots_sealed BEFORE UPDATE OR DELETE ON evaluation_snapshots
    FOR EACH ROW EXECUTE FUNCTION pamledger_refuse_change();
CREATE TRIGGER evaluation_snapshots_no_truncate BEFORE TRUNCATE ON evaluation_snapshots
    FOR EACH STATEMENT EXECUTE FUNCTION pamledger_refuse_change();
