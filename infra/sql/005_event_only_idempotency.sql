-- Event-only ledger entries (subscription_opened / subscription_closed) honour idempotency keys too: a
-- retried open or close (an SDK retry after a timeout, a gateway finishing a close after a crash) replays
-- the entry it already wrote instead of writing a second one. Their records name no object or version.
ALTER TABLE idempotency_records ALTER COLUMN object_id DROP NOT NULL;
ALTER TABLE idempotency_records ALTER COLUMN version_id DROP NOT NULL;
ALTER TABLE idempotency_records ADD CONSTRAINT idempotency_records_version_or_entry
    CHECK ((object_id IS NULL) = (version_id IS NULL));
