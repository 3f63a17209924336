-- Settles a batch of leases held by $6 (a node, or a pull consumer's receipt): succeeded,
-- failed, expired, or pending again at its retry time. A snoozed task ($7) is pending
-- again with its attempt count as before this attempt (a snooze does not count), and one
-- more snooze counted; one that has had its biz type's max_snoozes already is failed
-- instead, so that a receiver that snoozes for ever cannot grow its history without end
-- (an attempt row a snooze). A task held by its receiver's open breaker ($8) is pending
-- again too, its attempt count as before (not counted), without counting a snooze
-- (src/engine/breaker.rs). A task it ends failed or expired in a biz type with a
-- failure_url gets its failure notice in the same statement, so that none is lost and none
-- is made for a task that did not end (`failure_notices`).
-- So does its chat notice, in a biz type with a chat_url (`chat_notices`).
--
-- Locks: the rows it updates. Only rows still running under this holder are changed: if a
-- lease ran out and another holder took the task, its state is that holder's to record.
-- The biz types are read, not locked: a failure_url or max_snoozes changed meanwhile
-- applies from the next settled task.
--
-- The engine's sessions plan no sequential scan, so the update finds the running tasks
-- through tasks_lease_idx (running tasks only) or the primary key, whatever the statistics
-- say. (t.id = ANY(ids) here would be re-sorted for every joined row.) A retry or snooze
-- past the hot horizon was moved to cold storage by later_cold.sql just before, so it is not
-- here; the `least` only keeps a row inside the partitions should the horizon have been
-- read differently between the two statements.
--
-- $9 and $10 are the least and greatest of the batch's run_at ($2): the engine's sessions
-- keep one generic plan (src/engine/mod.rs, `hot_path`), which prunes by parameters as the
-- statement starts, so the partitions outside them are neither opened nor read. Without
-- them every retained partition's index was opened at each batch (30 days of daily
-- partitions: 0.10 ms a batch where the pruned one takes 0.056, the empty table's).
WITH settled AS (
    UPDATE tasks t
       SET status = CASE WHEN o.snoozed AND t.snoozes >= b.max_snoozes THEN 'failed' ELSE o.status END,
           run_at = CASE WHEN o.status = 'pending' AND NOT (o.snoozed AND t.snoozes >= b.max_snoozes)
                         THEN least(o.retry_at, (SELECT until FROM hot_horizon) - interval '1 second')
                         ELSE t.run_at END,
           lease_until = NULL, leased_by = NULL,
           attempt_count = CASE WHEN o.snoozed OR o.held THEN t.attempt_count - 1 ELSE t.attempt_count END,
           snoozes = CASE WHEN o.snoozed THEN t.snoozes + 1 ELSE t.snoozes END,
           last_error = CASE WHEN o.snoozed AND t.snoozes >= b.max_snoozes
                             THEN format('failed: the receiver snoozed it %s times, the most its biz type allows (max_snoozes); '
                                         'raise max_snoozes, or replay the task to start counting again', t.snoozes)
                             ELSE o.error END,
           finished_at = CASE WHEN o.status = 'pending' AND NOT (o.snoozed AND t.snoozes >= b.max_snoozes)
                              THEN NULL ELSE now() END,
           updated_at = now()
      FROM unnest($1::uuid[], $2::timestamptz[], $3::text[], $4::timestamptz[], $5::text[], $7::boolean[], $8::boolean[])
           AS o(id, run_at, status, retry_at, error, snoozed, held),
           biz_types b
     WHERE t.id = o.id AND t.run_at = o.run_at AND t.status = 'running' AND t.leased_by = $6
       AND t.run_at BETWEEN $9 AND $10
       AND b.id = t.biz_type_id
    RETURNING t.id, t.biz_type_id, t.status, b.failure_url,
              b.chat_url
), chat AS (
    INSERT INTO chat_notices (biz_type_id, task_id, event)
    SELECT s.biz_type_id, s.id, 'task.' || s.status
      FROM settled s
     WHERE s.status IN ('failed', 'expired') AND s.chat_url IS NOT NULL
)
INSERT INTO failure_notices (biz_type_id, task_id, event)
SELECT s.biz_type_id, s.id, 'task.' || s.status
  FROM settled s
 WHERE s.status IN ('failed', 'expired') AND s.failure_url IS NOT NULL
