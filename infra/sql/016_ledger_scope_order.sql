-- A scope's ledger events in ledger order after a position (query.events: Inspect History of a whole scope, the
-- MCP binding's events resource): one range scan of this index instead of every row of the scope sorted.
CREATE INDEX ledger_scope_sequence_idx ON ledger (scope_id, partition, ledger_sequence);
