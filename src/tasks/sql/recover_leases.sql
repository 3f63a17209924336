-- Puts back the tasks whose lease ran out, 1,000 at a time, recording the lost attempt.
--
-- A callback lease runs out when its node died: not the task's fault, so it is simply
-- pending again. A pull reservation runs out when the consumer did not ack within the
-- time to run: a failed attempt, which may be the last one. Either way, a task whose
-- deadline has passed ends `expired` (it would be due again now, and no callback starts
-- after the deadline). Answers each task's biz type and whether it expired.
--
-- Locks: the expired rows, FOR UPDATE SKIP LOCKED, so that this is safe on every node at
-- once (rows being recovered elsewhere, or settled by their holder right now, are skipped).
--
-- A task it ends failed (a reservation that used up its attempts) or expired, in a biz type
-- with a failure_url, gets its failure notice here too (`failure_notices`); in one with a
-- chat_url, its chat notice (`chat_notices`).
WITH expired AS (
    SELECT t.id, t.biz_type_id, t.run_at, t.attempt_count, t.leased_by, t.updated_at, b.name AS biz_type,
           b.mode = 'pull' AS pull, b.mode = 'pull' AND t.attempt_count >= b.max_attempts AS exhausted,
           NOT (b.mode = 'pull' AND t.attempt_count >= b.max_attempts) AND coalesce(t.expires_at <= now(), false) AS expired,
           t.expires_at
      FROM tasks t JOIN biz_types b ON b.id = t.biz_type_id
     WHERE t.status = 'running' AND t.lease_until < now()
     LIMIT 1000
     FOR UPDATE OF t SKIP LOCKED
), why AS (
    SELECT e.*, CASE WHEN pull THEN 'time to run passed without an ack or nack'
                     ELSE 'lease expired: the node delivering it stopped before recording a result' END AS error
      FROM expired e
), requeued AS (
    UPDATE tasks t
       SET status = CASE WHEN w.exhausted THEN 'failed' WHEN w.expired THEN 'expired' ELSE 'pending' END,
           finished_at = CASE WHEN w.exhausted OR w.expired THEN now() END,
           lease_until = NULL, leased_by = NULL, updated_at = now(),
           last_error = CASE WHEN w.expired
                             THEN format('expired at %s: not delivered before its deadline (last attempt: %s)', w.expires_at, w.error)
                             ELSE w.error END
      FROM why w
     WHERE t.id = w.id AND t.run_at = w.run_at
), attempted AS (
    INSERT INTO attempts (task_id, number, started_at, duration_ms, error, node_id, biz_type_id)
    SELECT id, attempt_count, CASE WHEN pull THEN updated_at ELSE now() END,
           CASE WHEN pull THEN (extract(epoch FROM now() - updated_at) * 1000)::int ELSE 0 END,
           error, CASE WHEN pull THEN NULL ELSE leased_by END, biz_type_id
      FROM why
), noticed AS (
    INSERT INTO failure_notices (biz_type_id, task_id, event)
    SELECT w.biz_type_id, w.id, CASE WHEN w.exhausted THEN 'task.failed' ELSE 'task.expired' END
      FROM why w JOIN biz_types b ON b.id = w.biz_type_id
     WHERE (w.exhausted OR w.expired) AND b.failure_url IS NOT NULL
), chat AS (
    INSERT INTO chat_notices (biz_type_id, task_id, event)
    SELECT w.biz_type_id, w.id, CASE WHEN w.exhausted THEN 'task.failed' ELSE 'task.expired' END
      FROM why w JOIN biz_types b ON b.id = w.biz_type_id
     WHERE (w.exhausted OR w.expired) AND b.chat_url IS NOT NULL
)
SELECT biz_type, expired FROM why
