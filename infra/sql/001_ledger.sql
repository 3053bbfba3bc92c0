-- The ledger (append-only, hash-chained, gapless writer-assigned sequence), the authoritative version
-- index, the erasable content store, durable idempotency records and the scope registry.

CREATE TABLE ledger (
    partition        integer     NOT NULL DEFAULT 0,
    ledger_sequence  bigint      NOT NULL CHECK (ledger_sequence >= 1),
    event_id         text        NOT NULL UNIQUE,
    operation_id     text        NOT NULL,
    scope_id         text        NOT NULL,
    object_id        text,
    version_id       text,
    event_type       text        NOT NULL,
    recorded_at      timestamptz NOT NULL,
    event            bytea       NOT NULL,
    prev_hash        bytea       NOT NULL,
    row_hash         bytea       NOT NULL,
    PRIMARY KEY (partition, ledger_sequence)
);
CREATE INDEX ledger_object_idx ON ledger (scope_id, object_id, ledger_sequence);

CREATE FUNCTION pamledger_refuse_change() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'pamledger: % is append-only; % refused', TG_TABLE_NAME, TG_OP
        USING ERRCODE = 'insufficient_privilege';
END $$;

CREATE TRIGGER ledger_append_only BEFORE UPDATE OR DELETE ON ledger
    FOR EACH ROW EXECUTE FUNCTION pamledger_refuse_change();
CREATE TRIGGER ledger_no_truncate BEFORE TRUNCATE ON ledger
    FOR EACH STATEMENT EXECUTE FUNCTION pamledger_refuse_change();

CREATE TABLE memory_versions (
    scope_id        text    NOT NULL,
    object_id       text    NOT NULL,
    sequence        integer NOT NULL CHECK (sequence >= 1),
    version_id      text    NOT NULL UNIQUE,
    ledger_sequence bigint  NOT NULL,
    meta            bytea   NOT NULL,
    content_digest  text,
    PRIMARY KEY (scope_id, object_id, sequence)
);

CREATE TRIGGER memory_versions_immutable BEFORE UPDATE OR DELETE ON memory_versions
    FOR EACH ROW EXECUTE FUNCTION pamledger_refuse_change();
CREATE TRIGGER memory_versions_no_truncate BEFORE TRUNCATE ON memory_versions
    FOR EACH STATEMENT EXECUTE FUNCTION pamledger_refuse_change();

-- Canonical content lives only here, so delete and redaction can remove it for real.
CREATE TABLE content_store (
    content_digest text  PRIMARY KEY,
    scope_id       text  NOT NULL,
    object_id      text  NOT NULL,
    salt           bytea NOT NULL,
    content        bytea NOT NULL
);
CREATE INDEX content_store_object_idx ON content_store (scope_id, object_id);

CREATE TABLE idempotency_records (
    scope_id        text   NOT NULL,
    idempotency_key text   NOT NULL,
    request_digest  text   NOT NULL,
    object_id       text   NOT NULL,
    version_id      text   NOT NULL,
    ledger_sequence bigint NOT NULL,
    PRIMARY KEY (scope_id, idempotency_key)
);

CREATE TABLE scopes (
    scope_id        text        PRIMARY KEY,
    scope_kind      text        NOT NULL,
    parent_scope_id text,
    policy          jsonb,
    created_at      timestamptz NOT NULL DEFAULT now()
);
