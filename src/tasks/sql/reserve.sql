-- Reserves up to $2 due tasks of pull biz type $1 for $3 ms: the claim (claim.sql, whose
-- comment explains the plan) with a consumer as the holder. Each task gets a receipt of
-- its own, a random UUID in leased_by, which settles that reservation only.
--
-- Locks: the picked rows, FOR UPDATE SKIP LOCKED, as the claim does; a task is held by one
-- engine or one consumer at a time.
WITH due AS (
    SELECT id FROM tasks
     WHERE biz_type_id = $1 AND status = 'pending' AND run_at <= now()
     ORDER BY run_at
     LIMIT $2
     FOR UPDATE SKIP LOCKED
), leased AS (
    UPDATE tasks t
       SET status = 'running', lease_until = now() + $3 * interval '1 millisecond', leased_by = gen_random_uuid(),
           attempt_count = t.attempt_count + 1, updated_at = now()
     WHERE t.id = ANY(ARRAY(SELECT id FROM due))
    RETURNING t.*
)
SELECT leased.*, $4::text AS biz_type, leased.lease_until AS reserved_until, leased.leased_by AS receipt
  FROM leased ORDER BY run_at
