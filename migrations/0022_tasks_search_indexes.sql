-- The console's searches that no list index serves (src/tasks/queries.rs, `list`):
--
-- `tasks_payload_idx`: "payload contains" (`payload @> '{"order_id": 123}'`), within a biz
-- type. Without it the search reads every task of the biz type (measured: 500 ms for
-- 250,000 tasks, page and count). jsonb_path_ops: smaller than the default and serves
-- only `@>`, the one operator asked. What it costs at insert is in the README ("Console").
--
-- `tasks_retrying_idx`: the retrying tasks (pending, tried before), in a biz type's due
-- order, as the list walks them; the same condition as `tasks::RETRYING_SQL`. New tasks
-- are not in it: only a retry adds an entry (measured without it: 430 ms to count 10,000
-- retrying among 250,000 pending).
--
-- Both made `ON ONLY` the partitioned parent, at once, as 0015 does (migrations/README.md):
-- the leader's `partitions::complete_indexes` builds each partition's concurrently and
-- attaches it; partitions made from now on get theirs with their table. Until then the
-- searches are correct, only slower. A brief lock on the parent.
CREATE INDEX IF NOT EXISTS tasks_payload_idx ON ONLY tasks USING gin (payload jsonb_path_ops);
CREATE INDEX IF NOT EXISTS tasks_retrying_idx ON ONLY tasks (biz_type_id, run_at, id)
    WHERE status = 'pending' AND (attempt_count > 0 OR last_error IS NOT NULL);
