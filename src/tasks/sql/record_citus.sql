-- record_tasks.sql on a Citus cluster (docs/design/citus.md, Recording), for the tasks of
-- ONE biz type, $9, so that Citus sends it to the worker of that biz type's shard; the
-- engine runs it per biz type of a batch (`tasks::lease::record_tasks_citus`), in the
-- batch's transaction. Parameters as record_tasks.sql's ($1 to $8), then $9 the biz type
-- and $10 the hot horizon, read by the engine on the coordinator (a worker cannot read it).
-- Returns each task it settled and its new state; the engine then inserts the notices of
-- those it ended failed or expired (notices_citus.sql), which record_tasks.sql does in CTEs.
--
-- Why not record_tasks.sql: Citus refuses, in an UPDATE of a distributed table, a CASE
-- holding a function that is not IMMUTABLE ("non-IMMUTABLE functions are not allowed in
-- CASE or COALESCE statements"), and a STABLE function of the row's columns. So each
-- settled row's new values are worked out by a SELECT (`next`, which may hold anything),
-- with record_tasks.sql's rules, and the UPDATE only copies them. Citus runs it in two
-- steps, both on the one worker: `next`, then the UPDATE reading its result.
--
-- Locks: the rows it updates. As in record_tasks.sql, only rows still running under this
-- holder ($6) are changed: the UPDATE checks it again on the locked row, so a lease taken
-- over between `next` and the UPDATE is left to its new holder. Only the holder changes a
-- task it holds, so what `next` read of it (attempts, snoozes) is what the UPDATE finds.
WITH next AS (
    SELECT t.id, t.run_at,
           CASE WHEN o.snoozed AND t.snoozes >= b.max_snoozes THEN 'failed' ELSE o.status END AS status,
           CASE WHEN o.status = 'pending' AND NOT (o.snoozed AND t.snoozes >= b.max_snoozes)
                THEN least(o.retry_at, $10 - interval '1 second') ELSE t.run_at END AS new_run_at,
           CASE WHEN o.snoozed OR o.held THEN t.attempt_count - 1 ELSE t.attempt_count END AS attempt_count,
           CASE WHEN o.snoozed THEN t.snoozes + 1 ELSE t.snoozes END AS snoozes,
           CASE WHEN o.snoozed AND t.snoozes >= b.max_snoozes
                THEN format('failed: the receiver snoozed it %s times, the most its biz type allows (max_snoozes); '
                            'raise max_snoozes, or replay the task to start counting again', t.snoozes)
                ELSE o.error END AS last_error,
           CASE WHEN o.status = 'pending' AND NOT (o.snoozed AND t.snoozes >= b.max_snoozes) THEN NULL ELSE now() END AS finished_at
      FROM unnest($1::uuid[], $2::timestamptz[], $3::text[], $4::timestamptz[], $5::text[], $7::boolean[], $8::boolean[])
           AS o(id, run_at, status, retry_at, error, snoozed, held)
      JOIN tasks t ON t.biz_type_id = $9 AND t.id = o.id AND t.run_at = o.run_at
      JOIN biz_types b ON b.id = $9
     WHERE t.status = 'running' AND t.leased_by = $6
)
UPDATE tasks t
   SET status = n.status, run_at = n.new_run_at, lease_until = NULL, leased_by = NULL, attempt_count = n.attempt_count,
       snoozes = n.snoozes, last_error = n.last_error, finished_at = n.finished_at, updated_at = now()
  FROM next n
 WHERE t.biz_type_id = $9 AND t.id = n.id AND t.run_at = n.run_at AND t.status = 'running' AND t.leased_by = $6
RETURNING t.id, t.status
