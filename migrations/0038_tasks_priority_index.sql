-- The claim's index of pending tasks whose priority is not the default, one range per biz
-- type and priority in run_at order (src/tasks/sql/claim.sql probes each level). Tasks of
-- the default priority are not in it, so a biz type that never sets one pays a descent
-- into an empty index per level and claim, and its writes nothing.
--
-- Made `ON ONLY` the parent (at once, no rows read) and completed by the leader partition
-- by partition, concurrently (migrations/README.md, as 0015). Until then a claim is
-- correct, only slower where priorities are used.
CREATE INDEX IF NOT EXISTS tasks_priority_idx ON ONLY tasks (biz_type_id, priority, run_at, id)
    WHERE status = 'pending' AND priority <> 5;
