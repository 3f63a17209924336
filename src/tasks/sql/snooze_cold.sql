-- Moves tasks snoozed ($1, $2: id and run_at) until a time ($3) at or beyond the hot
-- horizon into cold storage, pending and due then, before record_tasks.sql settles the
-- rest: record_tasks.sql keeps a retry inside the horizon (`least(retry_at, horizon - 1s)`),
-- which for a snooze would call the receiver back early, at the horizon's edge. In cold
-- storage the migrator moves it back into the partitions as the horizon reaches it, as
-- it does a task created that far ahead. The attempt count is put back as record_tasks.sql
-- does for a snooze (a snooze does not count toward max_attempts); its attempt row is
-- written by record_attempts.sql like any other.
--
-- Locks: the rows it deletes, only those still running under holder $4 (a lease that ran
-- out and went to another holder is that holder's to settle). A moved row is gone from
-- `tasks`, so record_tasks.sql then finds nothing to change for it.
WITH snoozed AS (
    SELECT s.id, s.run_at, s.until
      FROM unnest($1::uuid[], $2::timestamptz[], $3::timestamptz[]) AS s(id, run_at, until)
     WHERE s.until >= (SELECT until FROM hot_horizon)
), moved AS (
    DELETE FROM tasks t USING snoozed s
     WHERE t.id = s.id AND t.run_at = s.run_at AND t.status = 'running' AND t.leased_by = $4
    RETURNING t.*, s.until AS snoozed_until
)
INSERT INTO tasks_cold (id, biz_type_id, key, run_at, payload, status, attempt_count, timer_id, last_error,
                        lease_until, leased_by, created_at, updated_at, finished_at, expires_at, traceparent,
                        first_run_at)
SELECT id, biz_type_id, key, snoozed_until, payload, 'pending', attempt_count - 1, timer_id, NULL,
       NULL, NULL, created_at, now(), NULL, expires_at, traceparent, first_run_at
  FROM moved
