-- [M2] The full-text index keeps a pending list of new entries (GIN fastupdate) and merges it into the
-- index when it exceeds gin_pending_list_limit; the insert that crosses the limit does the merge. With
-- the 4 MB default that merge stalled one projector batch for about 100 ms every ~9,000 new rows
-- (measured on 2 cores), which is what a commit -> queryable p99 sees. At 256 kB the stall is about
-- 20 ms, for about 5% more insert work. `replay` copies the index definition, setting included.
ALTER INDEX current_objects_search_idx SET (gin_pending_list_limit = 256);
