-- Reserves up to $2 due tasks of pull biz type $1 for $3 ms: the claim (claim.sql, whose
-- comment explains the plan and the run_at bounds that prune the retained partitions)
-- with a consumer as the holder, and its pick (pick.sql): by priority, $5 of them the
-- longest-due whatever their priority; $6 is a lower bound on run_at, when known. Each
-- task gets a receipt of its own, a random UUID in leased_by, which settles that
-- reservation only.
--
-- Locks: the picked rows, FOR UPDATE SKIP LOCKED, as the claim does; a task is held by one
-- engine or one consumer at a time.
--
-- A picked task whose deadline has passed is ended `expired` instead of reserved, for the
-- claim's reasons (claim.sql), with its failure notice and its chat notice
-- (`chat_notices`); it comes back with `expired` set,
-- and `lease::reserve` counts it and hands it to no consumer.
WITH wants AS (
    SELECT $1::int AS biz_type_id, $2::int8 AS n, 0::int8 AS ahead_ms, $5::int8 AS oldest, NULL::int AS lane
),
{pick}, leased AS (
    UPDATE tasks t
       SET status = CASE WHEN t.expires_at <= now() THEN 'expired' ELSE 'running' END,
           lease_until = CASE WHEN t.expires_at <= now() THEN NULL ELSE now() + $3 * interval '1 millisecond' END,
           leased_by = CASE WHEN t.expires_at <= now() THEN NULL ELSE gen_random_uuid() END,
           attempt_count = CASE WHEN t.expires_at <= now() THEN t.attempt_count ELSE t.attempt_count + 1 END,
           finished_at = CASE WHEN t.expires_at <= now() THEN now() END,
           last_error = CASE WHEN t.expires_at <= now()
                             THEN format('expired at %s: not delivered before its deadline (due at %s, no consumer '
                                         'reserved it by then)', t.expires_at, t.run_at)
                             ELSE t.last_error END,
           updated_at = now()
     WHERE t.id = ANY(ARRAY(SELECT id FROM picked))
       AND t.run_at BETWEEN (SELECT min(run_at) FROM picked) AND (SELECT max(run_at) FROM picked)
       AND t.run_at >= coalesce($6, '-infinity')
    RETURNING t.*
), notices AS (
    INSERT INTO failure_notices (biz_type_id, task_id, event)
    SELECT l.biz_type_id, l.id, 'task.expired' FROM leased l JOIN biz_types b ON b.id = l.biz_type_id
     WHERE l.status = 'expired' AND b.failure_url IS NOT NULL
), chat AS (
    INSERT INTO chat_notices (biz_type_id, task_id, event)
    SELECT l.biz_type_id, l.id, 'task.expired' FROM leased l JOIN biz_types b ON b.id = l.biz_type_id
     WHERE l.status = 'expired' AND b.chat_url IS NOT NULL
)
SELECT leased.*, $4::text AS biz_type, coalesce(leased.lease_until, now()) AS reserved_until,
       coalesce(leased.leased_by, '00000000-0000-0000-0000-000000000000') AS receipt, leased.status = 'expired' AS expired
  FROM leased ORDER BY priority DESC, run_at
