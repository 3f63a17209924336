-- Leases up to $2 tasks of biz type $1 to node $4: those due now and those due within the
-- next $5 ms (the engine holds those until they are due), for $3 ms from now.
--
-- Locks: the picked rows, FOR UPDATE SKIP LOCKED, so that claimers on other nodes pass
-- over rows being taken rather than wait for them, and no two nodes hold one task.
--
-- The pick is a CTE to fence the planner: it must apply the LIMIT before the UPDATE joins
-- back (a nested loop over the subquery could otherwise update more rows than asked for).
-- It walks tasks_claim_idx, which holds pending tasks only, in run_at order, and
-- partitions wholly in the future are pruned at run time, so its cost does not grow with
-- future or finished tasks.
--
-- The UPDATE finds the picked rows through each partition's primary key, given the ids
-- as an array; not by a join, whose plan rests on statistics: with those of a partition
-- analysed while empty, the planner chose a nested loop that read the whole partition
-- once per picked row (3.6 s per claim during a burst of 50,000). Nor with a run_at range
-- to prune partitions: with those statistics, the planner walked the list index through
-- the range instead (50,000 rows read when all were due at one instant). The cost is a
-- probe of 200 ids in each retained partition, well under a millisecond each.
WITH due AS (
    SELECT id, run_at FROM tasks
     WHERE biz_type_id = $1 AND status = 'pending' AND run_at <= now() + $5 * interval '1 millisecond'
     ORDER BY run_at
     LIMIT $2
     FOR UPDATE SKIP LOCKED
)
UPDATE tasks t
   SET status = 'running', lease_until = now() + $3 * interval '1 millisecond', leased_by = $4,
       attempt_count = t.attempt_count + 1, updated_at = now()
 WHERE t.id = ANY(ARRAY(SELECT id FROM due))
RETURNING t.id, t.key, t.run_at, t.payload::text AS payload, t.attempt_count, t.timer_id,
          clock_timestamp() AS db_now
