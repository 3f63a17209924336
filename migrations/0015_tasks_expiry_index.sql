-- The expiry sweep's index (src/tasks/sql/expire.sql): pending tasks with a deadline, in
-- deadline order, so that finding the ones past it costs what it ends, not the queue.
--
-- `tasks` is partitioned, and PostgreSQL cannot build a partitioned table's index
-- concurrently (migrations/README.md): this makes the parent's index only (`ON ONLY`, at
-- once, no rows read; a brief lock on the parent), left invalid. The leader then builds
-- each existing partition's index concurrently and attaches it (src/partitions.rs,
-- `complete_indexes`), after which PostgreSQL marks this one valid; partitions created
-- from now on get theirs with their table. Until then the sweep is correct, only slower.
CREATE INDEX IF NOT EXISTS tasks_expiry_idx ON ONLY tasks (expires_at)
    WHERE status = 'pending' AND expires_at IS NOT NULL;

-- The expired tasks of a biz type, for the dashboard's count (capped, as the failed count
-- is with tasks_failed_idx): without it the count would read past every finished task.
-- Made and completed the same way.
CREATE INDEX IF NOT EXISTS tasks_expired_idx ON ONLY tasks (biz_type_id, run_at) WHERE status = 'expired';
