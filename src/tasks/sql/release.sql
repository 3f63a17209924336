-- Releases task $1 of biz type $2 held by a pull consumer under receipt $3, which a person
-- judged dead (the console's "release"): pending again at once, its lost attempt recorded
-- as lease recovery (recover_leases.sql) records a reservation whose time to run passed,
-- with the reason $4. Only while the task is still running under that receipt: a consumer
-- that acked, nacked or lost it meanwhile (or a reserve under a new receipt) is left alone.
-- Its run_at is kept (it was due when reserved), so the row stays in its partition.
--
-- Locks: the one row, FOR UPDATE (found by its primary key through the partitions), so
-- that an ack or lease recovery of the same task waits and then finds it no longer held.
WITH held AS (
    SELECT t.id, t.run_at, t.attempt_count, t.updated_at, t.biz_type_id
      FROM tasks t JOIN biz_types b ON b.id = t.biz_type_id
     WHERE t.id = $1 AND t.biz_type_id = $2 AND t.status = 'running' AND t.leased_by = $3 AND b.mode = 'pull'
     FOR UPDATE OF t
), requeued AS (
    UPDATE tasks t
       SET status = 'pending', lease_until = NULL, leased_by = NULL, updated_at = now(), last_error = $4
      FROM held h
     WHERE t.id = h.id AND t.run_at = h.run_at
), attempted AS (
    INSERT INTO attempts (task_id, number, started_at, duration_ms, error, node_id, biz_type_id)
    SELECT id, attempt_count, updated_at, (extract(epoch FROM now() - updated_at) * 1000)::int, $4, NULL, biz_type_id
      FROM held
)
SELECT count(*) FROM held
