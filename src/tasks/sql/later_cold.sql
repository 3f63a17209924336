-- Moves tasks pending again at a time ($3) at or beyond the hot horizon into cold storage,
-- pending and due then, before record_tasks.sql settles the rest: a snooze ($5 true), or a
-- retry at a receiver's Retry-After or a consumer's nack delay ($5 false). In the partitions
-- such a task could only wait at the horizon's edge, and be called back (or reserved) early.
-- In cold storage the migrator moves it back into the partitions as the horizon reaches it,
-- as it does a task created that far ahead. A snooze puts the attempt count back as
-- record_tasks.sql does (a snooze does not count toward max_attempts), counts one more
-- snooze and clears the error; one past its biz type's max_snoozes is not moved but left
-- to record_tasks.sql, which fails it. A retry keeps its count, its error ($6) as the
-- task's last. The attempt row is written by record_attempts.sql like any other.
--
-- Locks: the rows it deletes, only those still running under holder $4 (a lease that ran
-- out and went to another holder is that holder's to settle). The biz types are read, not
-- locked. A moved row is gone from `tasks`, so record_tasks.sql then finds nothing to
-- change for it.
WITH later AS (
    SELECT l.id, l.run_at, l.until, l.snoozed, l.error
      FROM unnest($1::uuid[], $2::timestamptz[], $3::timestamptz[], $5::boolean[], $6::text[])
           AS l(id, run_at, until, snoozed, error)
     WHERE l.until >= (SELECT until FROM hot_horizon)
), moved AS (
    DELETE FROM tasks t USING later l, biz_types b
     WHERE t.id = l.id AND t.run_at = l.run_at AND t.status = 'running' AND t.leased_by = $4
       AND b.id = t.biz_type_id AND NOT (l.snoozed AND t.snoozes >= b.max_snoozes)
    RETURNING t.*, l.until AS due_at, l.snoozed, l.error AS retry_error
)
INSERT INTO tasks_cold (id, biz_type_id, key, run_at, payload, status, attempt_count, timer_id, last_error,
                        lease_until, leased_by, created_at, updated_at, finished_at, expires_at, traceparent,
                        first_run_at, snoozes, priority, flow_key)
SELECT id, biz_type_id, key, due_at, payload, 'pending',
       CASE WHEN snoozed THEN attempt_count - 1 ELSE attempt_count END, timer_id,
       CASE WHEN snoozed THEN NULL ELSE retry_error END,
       NULL, NULL, created_at, now(), NULL, expires_at, traceparent, first_run_at,
       CASE WHEN snoozed THEN snoozes + 1 ELSE snoozes END, priority, flow_key
  FROM moved
