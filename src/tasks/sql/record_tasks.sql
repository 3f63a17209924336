-- Settles a batch of leases held by $6 (a node, or a pull consumer's receipt): succeeded,
-- failed, expired, or pending again at its retry time. A snoozed task ($7) is pending
-- again with its attempt count as before this attempt (a snooze does not count).
--
-- Locks: the rows it updates. Only rows still running under this holder are changed: if a
-- lease ran out and another holder took the task, its state is that holder's to record.
--
-- The engine's sessions plan no sequential scan, so the update finds the running tasks
-- through tasks_lease_idx (running tasks only) or the primary key, whatever the statistics
-- say. (t.id = ANY(ids) here would be re-sorted for every joined row.) A retry stays
-- inside the hot horizon, so that it never needs a partition that does not exist.
UPDATE tasks t
   SET status = o.status,
       run_at = CASE WHEN o.status = 'pending'
                     THEN least(o.retry_at, (SELECT until FROM hot_horizon) - interval '1 second')
                     ELSE t.run_at END,
       lease_until = NULL, leased_by = NULL,
       attempt_count = CASE WHEN o.snoozed THEN t.attempt_count - 1 ELSE t.attempt_count END,
       last_error = o.error,
       finished_at = CASE WHEN o.status = 'pending' THEN NULL ELSE now() END,
       updated_at = now()
  FROM unnest($1::uuid[], $2::timestamptz[], $3::text[], $4::timestamptz[], $5::text[], $7::boolean[])
       AS o(id, run_at, status, retry_at, error, snoozed)
 WHERE t.id = o.id AND t.run_at = o.run_at AND t.status = 'running' AND t.leased_by = $6
