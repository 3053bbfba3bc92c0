-- [X1] Subscribe per partition. A subscription belongs to its scope's partition: that partition's gateway
-- leads it (its own lock, feed and stream), takes it over after a crash, and is where its requests are routed.
-- Every subscription before this is of partition 0 (the only one a gateway followed).
ALTER TABLE subscriptions ADD COLUMN partition integer NOT NULL DEFAULT 0;
DROP INDEX subscriptions_open_idx;
CREATE INDEX subscriptions_open_idx ON subscriptions (partition, status) WHERE status = 'open';
