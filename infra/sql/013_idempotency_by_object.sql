-- [M5] An erasure rewrites the request digests of the erased object's idempotency records (command_handler.store,
-- "forgotten") inside the writer's transaction: find them by object, not by scanning the scope's records.
CREATE INDEX idempotency_records_object_idx ON idempotency_records (scope_id, object_id, ledger_sequence)
    WHERE object_id IS NOT NULL;
