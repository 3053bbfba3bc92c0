-- [M3] Delivery positions move from per-subscription durable JetStream consumers to this table: live
-- delivery now fans out from one partition feed inside the gateway, and catch-up readers are ephemeral.
-- `acked_sequence` is what the subscriber acknowledged (push) or was last returned (poll); the gateway
-- writes it every half second and a new gateway leader resumes each open subscription from it.
-- `operation_id` makes a retried open return the subscription the first attempt made.
-- status 'closing': the close was decided (no more delivery) but its ledger entry is not yet written;
-- the gateway finishes it, also after a takeover.

ALTER TABLE subscriptions ADD COLUMN acked_sequence bigint;
ALTER TABLE subscriptions ADD COLUMN operation_id text;
CREATE UNIQUE INDEX subscriptions_operation_idx ON subscriptions (operation_id) WHERE operation_id IS NOT NULL;
CREATE INDEX subscriptions_closing_idx ON subscriptions (status) WHERE status = 'closing';
COMMENT ON COLUMN subscriptions.acked_sequence IS
    'delivery resumes after this ledger sequence (NULL: start_sequence)';
