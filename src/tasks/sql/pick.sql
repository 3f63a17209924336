-- The `picked` CTE of claim.sql and reserve.sql (`{pick}` in them, `lease::with_pick`):
-- per biz type of `wants` (columns biz_type_id, n, oldest, ahead_ms), up to n of its tasks
-- due now or within ahead_ms, no earlier than $6 (when known: chime_unfinished_floor(),
-- migration 0036, a parameter so that the partitions of finished tasks are pruned as the
-- statement starts), locked FOR UPDATE SKIP LOCKED, with `ord`, the order they are taken
-- in (then run_at).
--
-- Priority (docs/design/claim.md): a biz type's due tasks are taken priority by priority,
-- 9 first, each in run_at order, one probe per level: of tasks_priority_idx (migration
-- 0038, pending tasks of a priority other than 5) for the others, of tasks_claim_idx for
-- 5, so that a biz type that never sets one walks what it did. First, though, come `oldest` of
-- its longest-due tasks whatever their priority (the engine passes a tenth of what it
-- claims, over time), when it has a due task of another priority than 5: a flood of
-- urgent tasks takes nine tenths of the deliveries and never starves the rest.
--
-- Lanes (docs/design/claim.md, Lanes): with `lane` set, a biz type without priorities has
-- its due tasks taken from that lane alone (chime_lane(id), migration 0051: 16 lanes by
-- the id's last byte, which goes in runs of 32 in a batch: tasks::ids), in run_at order,
-- through tasks_lane_idx. Several nodes working through one biz type's backlog each take
-- their own lanes, so that no claim reads and locks the rows another node has just claimed
-- at the shared head of the due order.
--
-- The priority branches below, last in the LATERAL, are pick_priority.sql's
-- (`lease::Pick::Full`), or, in most of the engine's claims (`lease::Pick::Plain`), one row
-- with no task (id NULL) for a biz type that would need them, which claim.sql reports (its
-- `prioritized` row).
--
picked AS (
    -- Per biz type, in the order it is claimed (`ord`, then run_at). A biz type with no
    -- due task of another priority than 5 (`prioritized`: one probe of
    -- tasks_priority_idx) has its due tasks taken in run_at order, as if priority were
    -- not there. Otherwise: `oldest` of its longest-due tasks, whatever their priority;
    -- then each priority from 9 to 0 (ord 1 to 10), in run_at order. Those branches run
    -- one after another and stop at n + oldest rows; a task found twice (the oldest are
    -- found again at their level) is locked twice by this transaction, which is no wait,
    -- and kept once.
    SELECT w.biz_type_id, f.id, f.run_at, f.ord
      FROM wants w
     CROSS JOIN LATERAL (
        -- OFFSET 0: probed once, not once per branch that reads it (the planner would
        -- otherwise copy the EXISTS into each).
        SELECT EXISTS (SELECT FROM tasks WHERE biz_type_id = w.biz_type_id AND status = 'pending'
                   AND run_at <= now() + w.ahead_ms * interval '1 millisecond' AND run_at >= coalesce($6, '-infinity') AND priority <> 5) AS prioritized
        OFFSET 0
     ) x
     CROSS JOIN LATERAL (
        (SELECT id, run_at, 5 AS ord FROM (SELECT id, run_at FROM tasks WHERE biz_type_id = w.biz_type_id AND status = 'pending'
                   AND run_at <= now() + w.ahead_ms * interval '1 millisecond' AND run_at >= coalesce($6, '-infinity') AND NOT x.prioritized
                   AND w.lane IS NULL
              ORDER BY run_at LIMIT w.n FOR UPDATE SKIP LOCKED) plain)
        UNION ALL
        -- One lane's due tasks (tasks_lane_idx), in run_at order.
        (SELECT id, run_at, 5 FROM (SELECT id, run_at FROM tasks WHERE biz_type_id = w.biz_type_id AND chime_lane(id) = w.lane
                   AND status = 'pending' AND run_at <= now() + w.ahead_ms * interval '1 millisecond' AND run_at >= coalesce($6, '-infinity')
                   AND NOT x.prioritized AND w.lane IS NOT NULL
              ORDER BY run_at LIMIT w.n FOR UPDATE SKIP LOCKED) lane)
        {by_priority}
     ) f
)
