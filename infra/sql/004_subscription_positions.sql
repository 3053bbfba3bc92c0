-- [M3] Delivery positions move from per-subscription durable JetStream consumers to this table: live
-- delivery now fans out from one partition feed inside the gateway, and catch-up readers are ephemeral.
-- `acked_sequence` is what the subscriber acknowledged (push) or was last returned (poll); the gateway
-- writes it every half second and a new gateway leader resumes each open subscription from it.

ALTER TABLE subscriptions ADD COLUMN acked_sequence bigint;
COMMENT ON COLUMN subscriptions.acked_sequence IS
    'delivery resumes after this ledger sequence (NULL: start_sequence)';
