-- [M3] Subscriptions the gateway serves. Their ledger entries (subscription_opened / _closed) go through
-- the writer; this table is the gateway's operational record so subscriptions survive restarts. The
-- delivery position itself lives in each subscription's durable JetStream consumer.

CREATE TABLE subscriptions (
    subscription_id         text        PRIMARY KEY,
    scope_id                text        NOT NULL,
    request                 bytea       NOT NULL,
    start_sequence          bigint      NOT NULL,
    status                  text        NOT NULL DEFAULT 'open',
    close_reason            text,
    last_delivered_sequence bigint      NOT NULL DEFAULT 0,
    created_at              timestamptz NOT NULL DEFAULT now(),
    closed_at               timestamptz
);
CREATE INDEX subscriptions_open_idx ON subscriptions (status) WHERE status = 'open';
