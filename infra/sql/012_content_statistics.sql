-- [M5] ANALYZE never samples stored content: the planner never filters on content_store.content, and a
-- sampled value would outlive the content's erasure in pg_statistic (until `pamledger scrub` or the next
-- ANALYZE). The full-text column keeps its statistics: text search plans need them (docs/security.md "Erasure").
ALTER TABLE content_store ALTER COLUMN content SET STATISTICS 0;
