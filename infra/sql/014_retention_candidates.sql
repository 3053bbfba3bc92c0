-- [M5] The retention evaluator's first half (retained objects whose valid_until has passed) reads this partial
-- index instead of every row of the projection each round. `replay` rebuilds it with the table (it copies the
-- live table's secondary indexes).
CREATE INDEX current_objects_retained_until_idx ON current_objects (valid_until)
    WHERE retention_state = 'retained' AND valid_until IS NOT NULL;
