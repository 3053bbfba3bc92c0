-- [H1] Every ledger has an identity: a random id that the JetStream stream (its metadata), every projection
-- checkpoint and every subscription position carry, so a role never follows a stream or a checkpoint of
-- another ledger. The id is made by the first role that needs it (infra/ledger_identity.py), not here: a
-- database cloned from a migrated template (CREATE DATABASE ... TEMPLATE) must not share its siblings' id,
-- while a database copied with its rows is the same ledger and keeps it. It never changes.

CREATE TABLE ledger_identity (
    partition  integer     PRIMARY KEY,
    ledger_id  text        NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now()
);
CREATE TRIGGER ledger_identity_append_only BEFORE UPDATE OR DELETE ON ledger_identity
    FOR EACH ROW EXECUTE FUNCTION pamledger_refuse_change();
CREATE TRIGGER ledger_identity_no_truncate BEFORE TRUNCATE ON ledger_identity
    FOR EACH STATEMENT EXECUTE FUNCTION pamledger_refuse_change();

CREATE FUNCTION pamledger_ledger_id(p integer) RETURNS text LANGUAGE sql STABLE AS
    $$ SELECT ledger_id FROM ledger_identity WHERE partition = p $$;

-- Rows written from now on carry the identity of their ledger; older rows (NULL) are stamped by the role
-- that checks them, when they are not ahead of the ledger head.
ALTER TABLE projection_checkpoints ADD COLUMN ledger_id text DEFAULT pamledger_ledger_id(0);
ALTER TABLE subscriptions ADD COLUMN ledger_id text DEFAULT pamledger_ledger_id(0);
