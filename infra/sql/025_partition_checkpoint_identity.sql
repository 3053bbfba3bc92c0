-- [X1] A follower's checkpoint row of partition p > 0 (`<name>.p<p>`, infra.projections.partition_checkpoint)
-- was stamped at insert with partition 0's ledger id (the column default of 007), so after a restart the
-- follower found "a checkpoint of another ledger" and refused to follow. New rows are now stamped with their
-- own partition's id (infra.projections.advance_checkpoint); this repairs the rows stamped wrongly.
UPDATE projection_checkpoints
   SET ledger_id = pamledger_ledger_id(substring(projection FROM '\.p([0-9]+)$')::integer)
 WHERE projection ~ '\.p[0-9]+$'
   AND ledger_id IS NOT DISTINCT FROM pamledger_ledger_id(0)
   AND pamledger_ledger_id(substring(projection FROM '\.p([0-9]+)$')::integer) IS NOT NULL;
