-- Every deciding process asks, every refresh period (0.5 s), how far the system scope's versions (actors,
-- credentials) have moved (infra.authz.registry): this partial index answers from its last entry instead of
-- reading every system-scope version. Other scopes' inserts only evaluate its predicate.
CREATE INDEX memory_versions_system_mark_idx ON memory_versions (ledger_sequence)
    WHERE scope_id = 'system:pamledger';
