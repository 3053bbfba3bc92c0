-- [E1] Evaluation runs (schemas/evaluation.py, command_handler/core/evaluation.py). The writer records each run
-- as an event-only `index_rebuilt` entry (action `evaluation_started`) in its new evaluation scope and keeps it
-- here by scope, in the same transaction, so it finds the run's clock and seed for every later command of
-- that scope; `ended_sequence` is set by the run's `evaluation_ended` entry. The ledger stays the source of
-- truth: `record` is the run as the started entry describes it.
CREATE TABLE evaluation_runs (
    scope_id          text   PRIMARY KEY,  -- the evaluation scope
    evaluation_run_id text   NOT NULL UNIQUE,
    started_sequence  bigint NOT NULL,
    record            bytea  NOT NULL,      -- canonical JSON: run_id, snapshot_id, base scope, watermark, clock, seed
    ended_sequence    bigint
);
