-- no-transaction
-- The tried pending tasks of a flow key in cold storage: an ordered key's head that a retry or a
-- snooze sent beyond the hot horizon (later_cold.sql) still holds its key (0043). Partial,
-- so it holds only such tasks and costs other cold writes nothing. Built without blocking
-- writes to tasks_cold (migrations/README.md, Locks).
CREATE INDEX CONCURRENTLY IF NOT EXISTS tasks_cold_flow_tried_idx ON tasks_cold (biz_type_id, flow_key)
    WHERE flow_key IS NOT NULL AND status = 'pending' AND (attempt_count > 0 OR snoozes > 0);
