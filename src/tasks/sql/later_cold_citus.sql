-- later_cold.sql on a Citus cluster (docs/design/citus.md, Recording): a retry or snooze of
-- biz type $6 due at or beyond the hot horizon is copied into cold storage, pending and due
-- then, with later_cold.sql's rules (a snooze puts the attempt count back, counts one more
-- snooze and clears the error; a retry keeps its count and its error as the task's last).
-- $1 to $5: the tasks moved, their run_at, when each is due again, whether it was a snooze,
-- the attempt's error. The engine runs it per biz type of a batch, in the record's
-- transaction (`tasks::lease::later_cold_citus`), in three statements, each routed whole to
-- the worker of the biz type's shard (EXPLAIN: one task; tests/citus/statements.rs):
--
--  1. a SELECT ... FOR UPDATE that picks and locks the rows to move: still running under
--     the holder, due again at or beyond the horizon (read by the engine on the
--     coordinator: a worker cannot read hot_horizon), a snooze not past max_snoozes (that
--     one is left to record_citus.sql, which fails it);
--  2. this INSERT ... SELECT, of exactly those rows (Citus pushes it down: tasks and
--     tasks_cold are colocated);
--  3. a DELETE of them from `tasks`.
--
-- Why not later_cold.sql: Citus cannot plan its DELETE ... RETURNING feeding an INSERT
-- ("could not create distributed plan"); with the biz type a constant it runs it, but pulls
-- the deleted rows through the coordinator. The rows locked by step 1 cannot change before
-- step 3: only their holder (this transaction) or lease recovery, which waits, would.
INSERT INTO tasks_cold (id, biz_type_id, key, run_at, payload, status, attempt_count, timer_id, last_error,
                        lease_until, leased_by, created_at, updated_at, finished_at, expires_at, traceparent,
                        first_run_at, snoozes, priority, flow_key)
SELECT t.id, t.biz_type_id, t.key, l.until, t.payload, 'pending',
       CASE WHEN l.snoozed THEN t.attempt_count - 1 ELSE t.attempt_count END, t.timer_id,
       CASE WHEN l.snoozed THEN NULL ELSE l.error END,
       NULL, NULL, t.created_at, now(), NULL, t.expires_at, t.traceparent, t.first_run_at,
       CASE WHEN l.snoozed THEN t.snoozes + 1 ELSE t.snoozes END, t.priority, t.flow_key
  FROM unnest($1::uuid[], $2::timestamptz[], $3::timestamptz[], $4::boolean[], $5::text[]) AS l(id, run_at, until, snoozed, error)
  JOIN tasks t ON t.biz_type_id = $6 AND t.id = l.id AND t.run_at = l.run_at
