-- [X1] Partitions. The ledger's partition count, recorded once (infra/partitions.py: by the first role that
-- starts, or 1 for a ledger that already holds rows) and never changed: a changed setting is refused at start.
-- A scope is assigned its partition when it is created, and keeps it (every scope before this is in 0).
CREATE TABLE ledger_layout (
    singleton  boolean     PRIMARY KEY DEFAULT true CHECK (singleton),
    partitions integer     NOT NULL CHECK (partitions >= 1),
    created_at timestamptz NOT NULL DEFAULT now()
);
CREATE TRIGGER ledger_layout_append_only BEFORE UPDATE OR DELETE ON ledger_layout
    FOR EACH ROW EXECUTE FUNCTION pamledger_refuse_change();
CREATE TRIGGER ledger_layout_no_truncate BEFORE TRUNCATE ON ledger_layout
    FOR EACH STATEMENT EXECUTE FUNCTION pamledger_refuse_change();

ALTER TABLE scopes ADD COLUMN partition integer NOT NULL DEFAULT 0;
